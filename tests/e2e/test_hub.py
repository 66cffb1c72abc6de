"""Hub ids as --model: served from a huggingface_hub cache laid out as huggingface_hub lays it
out, offline (no network in tests)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from support import cosines, start_server

REPO = "sentence-transformers/all-MiniLM-L6-v2"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


def lay_out_cache(hf_home: Path, source: Path, repo: str, commit: str) -> Path:
    """`source`'s files as huggingface_hub caches a repository: blobs named by their hash, a
    snapshot of links to them per commit, and refs/main naming the commit."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for file in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        blob = root / "blobs" / hashlib.sha256(str(file).encode()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.symlink_to(file)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Path:
    home = tmp_path_factory.mktemp("hf")
    lay_out_cache(home, minilm_path, REPO, COMMIT)
    return home


@pytest.fixture()
def offline(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf_home


def test_a_hub_id_is_served_from_the_cache_offline(
    offline: Path, tmp_path: Path, texts: list[str], reference: np.ndarray
) -> None:
    server = start_server(tmp_path, "--model", REPO, "--revision", "main")
    try:
        info = requests.get(f"{server.url}/info", timeout=30).json()
        assert info["model_id"] == REPO and info["model_path"].endswith(f"snapshots/{COMMIT}")
        response = requests.post(f"{server.url}/embed", json={"inputs": texts[:32]}, timeout=120)
        assert response.status_code == 200, response.text
        assert cosines(np.array(response.json(), dtype=np.float32), reference[:32]).min() >= 0.9999
    finally:
        server.stop()


def test_an_uncached_id_offline_is_a_clear_error(offline: Path, tmp_path: Path) -> None:
    log = tmp_path / "uncached.log"
    command = ["ivy-serve", "--model", "nobody/nothing", "--port", "0", "--grpc-port", "0"]
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
    text = log.read_text()
    assert code != 0 and "'nobody/nothing' is not in the cache" in text and "HF_HUB_OFFLINE" in text, text


CHECK_REVISIONS = f"""
from pathlib import Path
from rose.errors import ModelError
from rose.loading.model_dir import ModelDir, model_root
root = model_root({REPO!r}, {COMMIT!r})
assert root.name == {COMMIT!r} and ModelDir.open(root).model_id == {REPO!r}, root
try:
    model_root({REPO!r}, "0" * 40)
    raise SystemExit("a missing revision was served")
except ModelError as why:
    assert "not in the cache" in str(why), why
# A path is never taken for a hub id.
assert model_root("./no/such/folder") == Path("no/such/folder").resolve()
"""


def test_a_revision_names_a_commit_and_a_missing_one_is_an_error(offline: Path) -> None:
    # A fresh interpreter: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported.
    subprocess.run([sys.executable, "-c", CHECK_REVISIONS], check=True, timeout=120)
