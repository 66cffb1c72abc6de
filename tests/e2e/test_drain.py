"""Graceful drain: SIGTERM under load loses no admitted request; /health answers 503 at once,
new connections are served for --drain-delay and refused after; the process exits 0."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import requests

from support import start_server


def test_sigterm_under_load_loses_no_admitted_request(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--drain-delay", "2", "--shutdown-timeout", "30")
    texts = [f"passage {i} about the drain of a busy server, told at some length" for i in range(32)]
    answers: list[int] = []
    lost: list[str] = []
    refused = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        while not refused.is_set():
            try:
                # A new connection each time: a kept-alive one could be closed as it is reused.
                answer = requests.post(f"{server.url}/embed", json={"inputs": texts}, timeout=60)
            except requests.ConnectionError as why:
                if "refused" in str(why).lower():
                    refused.set()  # never admitted: the drain delay is over
                else:
                    with lock:
                        lost.append(str(why))
                continue
            with lock:
                answers.append(answer.status_code)

    threads = [threading.Thread(target=client) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        time.sleep(3)
        served_before = len(answers)
        server.process.terminate()
        time.sleep(0.5)
        health = requests.get(f"{server.url}/health", timeout=10)
        assert health.status_code == 503 and "shutting down" in health.json()["error"]
        assert requests.get(f"{server.url}/live", timeout=10).status_code == 200
        assert server.process.wait(timeout=60) == 0, server.log.read_text()[-2000:]
        refused.set()
        for t in threads:
            t.join(timeout=60)
    finally:
        refused.set()
        server.stop()
    assert not lost, lost[:3]
    assert answers and set(answers) == {200}, sorted(set(answers))
    assert len(answers) > served_before  # served during the drain delay too
    assert "draining" in server.log.read_text()
