"""`ivy-serve --model DIR` serves any local model folder: here a random BERT with CLS pooling,
prefixed weight names and prompts, checked against Hugging Face transformers in fp32."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from support import Server, cosines, save_tiny_bert, start_server

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    save_tiny_bert(root / "tiny-bert", "cls", prefix="bert.")
    save_tiny_bert(root / "hf", "cls")
    st_config = {"prompts": PROMPTS, "default_prompt_name": None}
    (root / "tiny-bert" / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return root


@pytest.fixture(scope="module")
def tiny_server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("logs"), "--model", str(folder / "tiny-bert"))
    yield server
    server.stop()


def transformers_cls(folder: Path, texts: list[str]) -> np.ndarray:
    from tokenizers import Tokenizer
    from transformers import AutoModel

    tok = Tokenizer.from_file(str(folder / "hf" / "tokenizer.json"))
    tok.no_padding()
    model = AutoModel.from_pretrained(folder / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        rows = [model(torch.tensor([tok.encode(t).ids])).last_hidden_state[0, 0] for t in texts]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


def test_serves_the_folder_with_its_pooling_and_prompts(tiny_server: Server, folder: Path) -> None:
    info = requests.get(f"{tiny_server.url}/info", timeout=10).json()
    assert (info["model_id"], info["pooling"], info["dimensions"]) == ("tiny-bert", "cls", 64)
    texts = ["a short one", "Быстрая лиса", "code: x = 1"]
    got = requests.post(f"{tiny_server.url}/embed", json={"inputs": texts}, timeout=60).json()
    assert cosines(np.array(got, dtype=np.float32), transformers_cls(folder, texts)).min() >= 0.9999
    prompted = requests.post(f"{tiny_server.url}/embed", json={"inputs": texts, "prompt_name": "query"}, timeout=60)
    expected = transformers_cls(folder, [PROMPTS["query"] + t for t in texts])
    assert cosines(np.array(prompted.json(), dtype=np.float32), expected).min() >= 0.9999
