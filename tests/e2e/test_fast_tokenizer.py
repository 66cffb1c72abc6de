"""The v1 tokenizer pipeline (--fast-tokenizer auto, the default) against the classic tokenizer
(--fast-tokenizer off): the same token counts and vectors for texts in many scripts, around and
past the limit, and the same refusal of a long input."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from support import Server, start_server, varied_texts


@pytest.fixture(scope="module")
def classic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("logs"), "--auto-truncate", "--fast-tokenizer", "off")
    yield running
    running.stop()


def info(server: Server) -> dict:
    return requests.get(f"{server.url}/info", timeout=10).json()


def embedded(server: Server, text: str) -> tuple[int, np.ndarray]:
    """The input's token count (the usage of a one-input request) and its vector."""
    response = requests.post(f"{server.url}/v1/embeddings", json={"input": text, "model": "m"}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    return body["usage"]["prompt_tokens"], np.array(body["data"][0]["embedding"], dtype=np.float32)


def test_the_v1_pipeline_gives_the_classic_tokenizers_ids(server: Server, classic: Server) -> None:
    # v1 loads in the background once the model is known; the classic tokenizer serves until then.
    deadline = time.monotonic() + 30
    while not info(server)["fast_tokenizer"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert info(server)["fast_tokenizer"] is True
    assert info(classic)["fast_tokenizer"] is False
    for text in varied_texts(120):
        ours, theirs = embedded(server, text), embedded(classic, text)
        assert ours[0] == theirs[0], f"token counts differ for {text!r}"
        np.testing.assert_allclose(ours[1], theirs[1], atol=1e-6, err_msg=repr(text))


def test_a_long_input_is_refused_alike(server: Server, classic: Server) -> None:
    body = {"inputs": "word " * 300, "truncate": False}
    answers = [requests.post(f"{s.url}/embed", json=body, timeout=60) for s in (server, classic)]
    assert [a.status_code for a in answers] == [422, 422]
    assert answers[0].json() == answers[1].json()
