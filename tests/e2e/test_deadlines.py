"""--request-timeout bounds a request end to end: past it, 504 naming the limit, and its work
leaves the queue (a query sent right after is not stuck behind the abandoned batch)."""

from __future__ import annotations

import time
from pathlib import Path

import requests

from support import start_server


def test_a_request_past_its_deadline_is_answered_504_and_leaves_the_queue(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--request-timeout", "1.5")
    try:
        passage = "a long passage about deadlines in a busy embedding server, " * 20
        # About 90,000 tokens: many seconds of work on this CPU, far past the deadline.
        big = {"inputs": [passage] * 360, "truncate": True}
        began = time.monotonic()
        late = requests.post(f"{server.url}/embed", json=big, timeout=60)
        assert late.status_code == 504, late.text
        assert late.json()["error_type"] == "timeout" and "--request-timeout" in late.json()["error"]
        assert time.monotonic() - began < 5
        # The abandoned batch's chunks left the queue: a query is answered within the deadline.
        query = requests.post(f"{server.url}/embed", json={"inputs": "a short query"}, timeout=60)
        assert query.status_code == 200, query.text
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert 'ivy_errors_total{error_type="timeout"} 1' in metrics
    finally:
        server.stop()
