"""Scale-out, end to end on the CPU: three tulip-serve replicas behind one ivy-serve under a steady
load while one is killed (and started again) or hangs; replicas found through a DNS name that
gains and loses addresses; two models behind one port as supervised workers; bad configurations.

Every answer under load is checked against the one-replica answer of the same texts."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file, save_file

import tulip
from support import (
    Server,
    Tulip,
    cosines,
    free_port,
    metric,
    replica,
    save_cross_encoder,
    save_tiny_bert,
    start_server,
)

# A chunk on a 2-core machine, under the load below with three replicas sharing its cores, can
# take many seconds: --replica-timeout sits far above that, so that only a failed health check
# (1 s) can give up a hung replica's chunk here.
REPLICA_TIMEOUT = 60
# How long the hung replica stays stopped: far longer than any request under this load takes
# (up to 11 s on the 2-core development machine).
HANG = 40
GATEWAY_FLAGS = ("--health-interval", "0.25", "--health-timeout", "1", "--replica-timeout", str(REPLICA_TIMEOUT))
GATEWAY_FLAGS += ("--auto-truncate",)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Polls `check` until it holds; returns when (monotonic), or fails naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return time.monotonic()
        except (requests.RequestException, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def info(server: Server) -> dict:
    return requests.get(f"{server.url}/info", timeout=10).json()


@dataclass
class Load:
    """Client batches and single queries sent back to back from threads until stopped; every
    answer is checked against `reference` (text -> the one-replica vector)."""

    url: str
    reference: dict[str, np.ndarray]
    results: list[tuple[float, float, str]] = field(default_factory=list)  # (sent, seconds, error or "")
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, batchers: int = 1, queriers: int = 2) -> Load:
        for i in range(batchers + queriers):
            size = 24 if i < batchers else 1
            thread = threading.Thread(target=self._run, args=(size, i), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, size: int, seed: int) -> None:
        rng = random.Random(seed)
        texts = list(self.reference)
        while not self._stop.is_set():
            batch = rng.sample(texts, size)
            sent = time.monotonic()
            error = ""
            try:
                answer = requests.post(f"{self.url}/v1/embeddings", json={"input": batch}, timeout=60)
                if answer.status_code != 200:
                    error = f"{answer.status_code}: {answer.text}"
                else:
                    got = np.array([row["embedding"] for row in answer.json()["data"]])
                    want = np.stack([self.reference[t] for t in batch])
                    if len(got) != len(batch) or cosines(got, want).min() < 0.9999:
                        error = "vectors differ from the one-replica answer"
            except requests.RequestException as e:
                error = repr(e)
            self.results.append((sent, time.monotonic() - sent, error))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def errors(self) -> list[str]:
        return [e for _, _, e in self.results if e]

    def p99(self, start: float, end: float) -> float:
        window = [s for sent, s, _ in self.results if start <= sent <= end]
        return float(np.percentile(window, 99)) if window else float("nan")


@pytest.fixture(scope="module")
def texts_module() -> list[str]:
    from support import varied_texts

    return varied_texts(120, seed=11)


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Tulip]]:
    """Three tulip-serve replicas of the default model on 127.0.0.2-4, one port; small batches,
    so that a client batch is cut into chunks for several replicas."""
    logs = tmp_path_factory.mktemp("trio")
    port = free_port()
    tulips = [Tulip(f"127.0.0.{i}", port, logs, ("--max-batch-tokens", "128")).start() for i in (2, 3, 4)]
    yield tulips
    for t in tulips:
        t.stop()


@pytest.fixture(scope="module")
def gateway(trio: list[Tulip], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    endpoints = ",".join(t.url for t in trio)
    server = start_server(tmp_path_factory.mktemp("gateway"), "--tulip-endpoint", endpoints, *GATEWAY_FLAGS)
    wait_until(lambda: all(r["state"] == "ready" for r in info(server)["replicas"]), 120, "all replicas ready")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_replica(trio: list[Tulip], texts_module: list[str], gateway: Server) -> dict[str, np.ndarray]:
    """Each text's vector from one replica alone (tulip.Client over its gRPC)."""
    client = tulip.Client(f"{trio[0].host}:{trio[0].port}", timeout=120)
    return dict(zip(texts_module, client.embed(texts_module), strict=True))


def test_a_killed_replica_loses_no_request_and_takes_chunks_again(
    gateway: Server, trio: list[Tulip], one_replica: dict[str, np.ndarray]
) -> None:
    victim = trio[1]
    load = Load(gateway.url, one_replica).start()
    time.sleep(3)
    killed = time.monotonic()
    victim.kill()
    time.sleep(3)
    victim.start()
    ready = wait_until(lambda: replica(info(gateway), victim.url)["state"] == "ready", 120, "restarted replica ready")
    chunks = replica(info(gateway), victim.url)["chunks"]
    took = wait_until(lambda: replica(info(gateway), victim.url)["chunks"] > chunks, 30, "the replica takes chunks")
    time.sleep(1)
    load.stop()
    assert load.errors() == []
    # The load crossed the failure: answers to requests in flight when the replica died, or sent
    # while it was down (a count would depend on the host's speed; a slow CI host answers ~15).
    crossed = [s for sent, s, _ in load.results if sent <= ready and sent + s >= killed]
    assert crossed, "no request was in flight while the replica was down"
    print(
        f"\nkill: {len(load.results)} requests, 0 failed; p99 during the failure {load.p99(killed, ready):.3f} s, "
        f"overall {load.p99(0, float('inf')):.3f} s; chunks again {took - ready:.2f} s after ready"
    )
    # Back in rotation at once: chunks of the next requests sent, so within one request's time
    # under this load (seconds on a slow host), not after a back-off.
    slowest = max(s for _, s, _ in load.results)
    assert took - ready < max(10, slowest + 2)


def test_a_hung_replicas_chunks_go_elsewhere_not_waited_for(
    gateway: Server, trio: list[Tulip], one_replica: dict[str, np.ndarray]
) -> None:
    victim = trio[2]
    retries = metric(gateway.url, "ivy_chunk_retries_total")
    load = Load(gateway.url, one_replica).start()
    time.sleep(2)
    stopped = time.monotonic()
    victim.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: replica(info(gateway), victim.url)["state"] == "down", 10, "hung replica marked down")
        time.sleep(max(0.0, stopped + HANG - time.monotonic()))
    finally:
        victim.signal(signal.SIGCONT)
    wait_until(lambda: replica(info(gateway), victim.url)["state"] == "ready", 30, "resumed replica ready")
    time.sleep(1)
    load.stop()
    assert load.errors() == []
    # Chunks were caught on the replica when it hung (and went elsewhere) ...
    assert metric(gateway.url, "ivy_chunk_retries_total") > retries
    # ... without waiting for it: a request that had waited would have lasted until it resumed.
    slowest = max(s for _, s, _ in load.results)
    print(f"\nhang: {len(load.results)} requests, 0 failed; slowest {slowest:.2f} s (hung for {HANG} s)")
    assert slowest < HANG - 5


HOSTS = Path("/etc/hosts")
NAME = "tulip-replicas.test"


@pytest.fixture
def hosts() -> Iterator[Callable[[list[str]], None]]:
    """Points NAME at the given addresses through /etc/hosts (what the system resolver reads, as a
    headless Service's DNS answer would), restored afterwards."""
    if not os.access(HOSTS, os.W_OK):
        pytest.skip("/etc/hosts is not writable here: the resolver loop is covered by the Rust tests")
    original = HOSTS.read_text()

    def point(addresses: list[str]) -> None:
        # Written in place: /etc/hosts is often a bind mount.
        HOSTS.write_text(original + "".join(f"{a} {NAME}\n" for a in addresses))

    yield point
    HOSTS.write_text(original)


def test_replicas_join_and_leave_as_the_name_resolves(
    trio: list[Tulip], hosts: Callable[[list[str]], None], tmp_path: Path, texts_module: list[str]
) -> None:
    first, second = trio[0], trio[1]
    hosts([first.host])
    endpoint = f"http://{NAME}:{first.port}"
    server = start_server(tmp_path, "--tulip-endpoint", endpoint, "--discovery-interval", "0.3", *GATEWAY_FLAGS)
    try:

        def urls() -> list[str]:
            return [r["url"] for r in info(server)["replicas"]]

        def embed() -> None:
            answer = requests.post(f"{server.url}/v1/embeddings", json={"input": texts_module[:24]}, timeout=60)
            assert answer.status_code == 200, answer.text

        assert urls() == [first.url]
        hosts([first.host, second.host])
        wait_until(lambda: replica(info(server), second.url)["state"] == "ready", 30, "the new address joins")
        wait_until(lambda: embed() or replica(info(server), second.url)["chunks"] > 0, 30, "it takes chunks")
        hosts([second.host])
        wait_until(lambda: urls() == [second.url], 30, "the gone address leaves")
        before = replica(info(server), second.url)["chunks"]
        for _ in range(3):
            embed()
        assert replica(info(server), second.url)["chunks"] > before
    finally:
        server.stop()


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return save_tiny_bert(root / "tiny-embedder", "mean"), save_cross_encoder(root / "tiny-reranker")


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_two_models_behind_one_port_each_answered_by_its_own(
    two_models: tuple[Path, Path], tmp_path: Path, texts_module: list[str]
) -> None:
    embedder, reranker = two_models
    server = start_server(tmp_path, "--model", str(embedder), "--model", str(reranker), *GATEWAY_FLAGS)
    try:
        listed = [m["id"] for m in requests.get(f"{server.url}/v1/models", timeout=10).json()["data"]]
        assert sorted(listed) == ["tiny-embedder", "tiny-reranker"]
        query, documents = "what is a cat", texts_module[:8]

        def embed(model: str = "tiny-embedder") -> requests.Response:
            body = {"input": texts_module[:16], "model": model}
            return requests.post(f"{server.url}/v1/embeddings", json=body, timeout=60)

        def rerank() -> requests.Response:
            body = {"model": "tiny-reranker", "query": query, "documents": documents}
            return requests.post(f"{server.url}/v1/rerank", json=body, timeout=60)

        alone_embed = tulip.Client.in_process(str(embedder), device="cpu").embed(texts_module[:16])
        got = np.array([row["embedding"] for row in embed().json()["data"]])
        assert cosines(got, alone_embed).min() >= 0.9999
        alone_scores = tulip.Client.in_process(str(reranker), device="cpu").rerank(query, documents)
        scored = {r["index"]: r["relevance_score"] for r in rerank().json()["results"]}
        want = {int(i): float(s) for i, s in alone_scores}
        assert scored.keys() == want.keys()
        assert max(abs(scored[i] - want[i]) for i in want) < 1e-4

        unknown = embed("text-embedding-3-small")
        assert unknown.status_code == 404
        assert "tiny-embedder" in unknown.json()["error"] and "tiny-reranker" in unknown.json()["error"]

        # One model's worker killed: the other model's requests are untouched, and the supervisor
        # starts the worker again.
        pid = next(p for p, cmd in children(server.process.pid).items() if str(reranker) in cmd)
        os.kill(pid, signal.SIGKILL)
        outage_end = time.monotonic() + 3
        while time.monotonic() < outage_end:
            assert embed().status_code == 200
        wait_until(lambda: rerank().status_code == 200, 120, "the reranker's worker serves again")
        assert any(str(reranker) in cmd for cmd in children(server.process.pid).values())
    finally:
        server.stop()
    assert children(server.process.pid) == {}


def test_replicas_as_worker_processes_on_the_cpu(tmp_path: Path, texts_module: list[str]) -> None:
    server = start_server(tmp_path, "--replicas", "2", "--devices", "cpu", "--max-batch-tokens", "128", *GATEWAY_FLAGS)
    try:
        wait_until(lambda: [r["state"] for r in info(server)["replicas"]] == ["ready"] * 2, 120, "both workers ready")

        def both_served() -> bool:
            # A worker whose health check is late on a loaded machine gets no chunk for a while.
            body = {"input": texts_module[:24]}
            assert requests.post(f"{server.url}/v1/embeddings", json=body, timeout=60).status_code == 200
            return all(r["chunks"] > 0 for r in info(server)["replicas"])

        wait_until(both_served, 60, "chunks on both workers")
        # /metrics has each worker's steps, labelled by its address, in one valid family.
        text = requests.get(f"{server.url}/metrics", timeout=10).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        steps = {s.labels["worker"]: s.value for s in families["tulip_batch_tokens"].samples
                 if s.name == "tulip_batch_tokens_count"}  # fmt: skip
        assert sorted(steps) == sorted(r["url"] for r in info(server)["replicas"])
        assert all(count > 0 for count in steps.values())
        assert families["ivy_requests"].samples, "the gateway's own metrics are kept"
    finally:
        server.stop()


def test_an_endpoint_that_answers_late_is_waited_for(tmp_path: Path) -> None:
    port, http = free_port(), free_port()
    command = ["ivy-serve", "--port", str(http), "--tulip-endpoint", f"http://127.0.0.1:{port}"]
    log = tmp_path / "ivy.log"
    ivy = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    late = Tulip("127.0.0.1", port, tmp_path)
    try:
        wait_until(lambda: "waiting for Tulip at" in log.read_text(), 30, "a log line while it waits")
        assert ivy.poll() is None
        late.start()
        wait_until(lambda: requests.get(f"http://127.0.0.1:{http}/health", timeout=1).ok, 120, "served once it answers")
    finally:
        ivy.terminate()
        ivy.wait(timeout=30)
        late.stop()


def test_an_unresolvable_name_is_a_start_up_error(tmp_path: Path) -> None:
    command = ["ivy-serve", "--port", str(free_port()), "--tulip-endpoint", "http://no-such-tulip.invalid:50051"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot resolve the Tulip endpoint no-such-tulip.invalid" in done.stdout + done.stderr


def test_one_name_serving_two_models_is_refused_naming_both(tmp_path: Path) -> None:
    a = save_tiny_bert(tmp_path / "a" / "tiny", "mean")
    b = tmp_path / "b" / "tiny"
    shutil.copytree(a, b)
    weights = load_file(b / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 0.01
    save_file(weights, b / "model.safetensors", metadata={"format": "pt"})
    port = free_port()
    tulips = [Tulip(f"127.0.0.{i}", port, tmp_path, ("--model", str(m))).start() for i, m in ((5, a), (6, b))]
    try:
        endpoints = ",".join(t.url for t in tulips)
        command = ["ivy-serve", "--port", str(free_port()), "--tulip-endpoint", endpoints]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "refused" in out and tulips[0].url in out and tulips[1].url in out and "weights" in out, out
    finally:
        for t in tulips:
            t.stop()


def test_the_tiny_models_weights_differ_by_their_fingerprint(tmp_path: Path) -> None:
    from rose.loading.fingerprint import fingerprint

    a = save_tiny_bert(tmp_path / "a", "mean")
    assert fingerprint(a) == fingerprint(a)
    weights = load_file(a / "model.safetensors")
    before = fingerprint(a)
    first = next(iter(weights))
    weights[first] = weights[first] * (1 + torch.finfo(torch.float32).eps * 4)
    save_file(weights, a / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(a) != before
