"""Weights copied onto the GPU by the CUDA driver before torch uses it (rose.loading.prestart): the same
tensors as safetensors' own loader, taken once, and a folder that was not staged read as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

import rose
from rose.loading import prestart
from rose.loading.weights import load_weights
from support import save_qwen3


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].is_cuda and got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


def test_staged_weights_are_the_files_tensors_and_are_taken_once(tmp_path: Path) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "tiny", bidirectional=False)
    want = load_file(folder / "model.safetensors", device="cuda")
    prestart.start("cuda", folder).join()
    driver, staged = prestart.take_staged([folder / "model.safetensors"], 0)
    assert driver is not None and list(staged) == [folder / "model.safetensors"]
    prestart.release(driver, list(staged.values()))

    prestart.start("cuda", folder).join()
    assert_same(load_weights(folder, device="cuda"), want)  # from the staged buffer
    assert prestart.take_staged([folder / "model.safetensors"], 0) == (None, {})
    assert_same(load_weights(folder, device="cuda"), want)  # from the file


def test_another_folder_than_the_staged_one_is_read_from_its_files(tmp_path: Path) -> None:
    staged, asked = (save_qwen3(tmp_path / name, "tiny", bidirectional=name == "b") for name in "ab")
    prestart.start("cuda", staged).join()
    assert_same(load_weights(asked, device="cuda"), load_file(asked / "model.safetensors", device="cuda"))
    assert prestart.take_staged([staged / "model.safetensors"], 0) == (None, {})  # freed, not kept


def test_an_engine_serves_the_staged_weights_as_it_serves_the_files(tmp_path: Path) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "tiny", bidirectional=False)
    sequences = [[5, 6, 7], list(range(100, 140))]
    from_files = rose.Engine(folder, device="cuda").embed_ids(sequences)
    prestart.start("cuda", folder).join()
    engine = rose.Engine(folder, device="cuda")
    assert prestart._staging is None  # taken by this engine
    np.testing.assert_allclose(engine.embed_ids(sequences), from_files, rtol=0, atol=1e-5)
