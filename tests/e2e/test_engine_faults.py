"""Engine faults stay local (a real ivy-serve, faults raised on purpose by `--inject-faults`, a
test-only flag): a failed step fails only its own requests with a 500 naming an engine fault and
the server goes on serving; an out-of-memory splits the batch and retries the halves; a fault the
process cannot survive makes /health fail at once and the process exit for its supervisor."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import requests

from support import metric, start_server


def embed(url: str, inputs: list) -> requests.Response:
    return requests.post(f"{url}/v1/embeddings", json={"input": inputs}, timeout=60)


def test_a_failed_step_fails_only_its_requests(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--inject-faults", "error@3")
    try:
        answers = [embed(server.url, [f"request number {i}"]) for i in range(8)]
        failed = [a for a in answers if a.status_code != 200]
        assert len(failed) == 1, [a.status_code for a in answers]
        assert failed[0].status_code == 500
        body = failed[0].json()
        assert body["error_type"] == "engine" and "engine fault" in body["error"] and "injected" in body["error"]
        assert metric(server.url, "tulip_engine_faults_total") == 1
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
        assert "engine step of" in server.log.read_text()  # logged with the batch's shape
    finally:
        server.stop()


def test_an_out_of_memory_splits_the_batch_and_retries(tmp_path: Path) -> None:
    texts = [" ".join(["word"] * n) for n in (100, 140, 120, 80)]  # each under 150 tokens, all over
    server = start_server(tmp_path, "--inject-faults", "oom>150")
    try:
        answer = embed(server.url, texts)
        assert answer.status_code == 200, answer.text
        together = np.array([d["embedding"] for d in answer.json()["data"]])
        alone = np.array([embed(server.url, [t]).json()["data"][0]["embedding"] for t in texts])
        np.testing.assert_allclose(together, alone, atol=1e-5)
        assert requests.get(f"{server.url}/info", timeout=10).json()["engine"]["oom_splits"] >= 1
        # One sequence over the size cannot be split: 429, the device has no room for it now.
        too_big = embed(server.url, [" ".join(["word"] * 200)])
        assert too_big.status_code == 429 and too_big.json()["error_type"] == "overloaded"
        assert embed(server.url, ["still serving"]).status_code == 200
    finally:
        server.stop()


def test_a_fatal_fault_fails_health_and_exits_for_the_supervisor(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--inject-faults", "fatal@2")
    try:
        answers = [embed(server.url, [f"request {i}"]) for i in range(2)]
        assert answers[0].status_code == 200 and answers[1].status_code == 500
        assert "fatal engine fault" in answers[1].json()["error"]
        deadline = time.monotonic() + 10
        health = 200
        while health == 200 and time.monotonic() < deadline:
            try:
                health = requests.get(f"{server.url}/health", timeout=2).status_code
            except requests.ConnectionError:
                break
            time.sleep(0.05)
        assert health != 200
        assert server.process.wait(timeout=15) == 70
        assert "fatal fault" in server.log.read_text()
    finally:
        server.stop()
