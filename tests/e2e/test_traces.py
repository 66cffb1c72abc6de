"""OpenTelemetry traces (`--otlp-endpoint`): a real OTLP/gRPC collector, served here with the
protocol's published stubs (opentelemetry-proto) on grpcio, receives Ivy's request span and
Tulip's call span inside it, in one process and across two (W3C `traceparent` over gRPC), under
the client's own trace when it sends one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import requests
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from support import Tulip, free_port, start_server

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every exported span with its service's name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        self.endpoint = ""

    def Export(self, request, context):  # noqa: N802 (the generated servicer's name)
        with self.lock:
            for resource_spans in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((attributes["service.name"], span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: bytes, names: set[str], timeout: float = 20) -> dict[str, tuple[str, object]]:
        """The spans of `trace_id` by name, once every one of `names` has arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                found = {span.name: (service, span) for service, span in self.spans if span.trace_id == trace_id}
            if names <= found.keys() or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


@pytest.fixture
def collector() -> Iterator[Collector]:
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    collector.endpoint = f"http://127.0.0.1:{port}"
    yield collector
    server.stop(0)


def attribute(span: object, key: str) -> object:
    for a in span.attributes:
        if a.key == key:
            return getattr(a.value, a.value.WhichOneof("value"))
    raise KeyError(key)


def test_one_trace_from_the_client_through_ivy_into_tulip(tmp_path: Path, collector: Collector) -> None:
    server = start_server(tmp_path, "--otlp-endpoint", collector.endpoint)
    try:
        assert requests.get(f"{server.url}/info", timeout=10).json()["otlp_endpoint"] == collector.endpoint
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        answer = requests.post(f"{server.url}/v1/embeddings", json={"input": ["a", "b"]}, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        # Exported while serving (the batch exporter's interval), not only at exit.
        spans = collector.trace(bytes.fromhex(CLIENT_TRACE), {"request", "embed"})
    finally:
        server.stop()
    assert {"request", "embed"} <= spans.keys(), [s.name for _, s in collector.spans]
    (service, request), (_, embed) = spans["request"], spans["embed"]
    assert service == "ivy-serve"
    assert request.parent_span_id == bytes.fromhex(CLIENT_SPAN)
    assert attribute(request, "path") == "/v1/embeddings"
    assert embed.parent_span_id == request.span_id
    assert attribute(embed, "sequences") == 2
    assert request.start_time_unix_nano <= embed.start_time_unix_nano <= embed.end_time_unix_nano


def test_the_trace_crosses_grpc_from_ivy_to_a_tulip_process(tmp_path: Path, collector: Collector) -> None:
    tulip = Tulip("127.0.0.1", free_port(), tmp_path, ("--otlp-endpoint", collector.endpoint)).start()
    server = None
    try:
        server = start_server(
            tmp_path, "--tulip-endpoint", tulip.url, "--otlp-endpoint", collector.endpoint, "--otlp-service-name", "gw"
        )
        answer = requests.post(f"{server.url}/v1/embeddings", json={"input": ["one query"]}, timeout=60)
        assert answer.status_code == 200, answer.text
    finally:
        # Both processes send the spans they still hold when they stop.
        if server is not None:
            server.stop()
        tulip.stop()
    requests_ = [span for service, span in collector.spans if service == "gw" and span.name == "request"]
    calls = [span for service, span in collector.spans if service == "tulip-serve" and span.name == "embed"]
    embedding = [s for s in requests_ if attribute(s, "path") == "/v1/embeddings"]
    assert len(embedding) == 1 and len(calls) == 1, [(service, s.name) for service, s in collector.spans]
    root, call = embedding[0], calls[0]
    assert root.parent_span_id == b""  # no traceparent from the client: Ivy starts the trace
    assert call.trace_id == root.trace_id and call.parent_span_id == root.span_id
