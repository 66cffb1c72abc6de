"""The one-launch decoders on the GPU (rose.fused_decoder's Triton kernel, rose.cuda_decoder's CUDA
one): a Qwen3 whose short batches take them matches the float32 reference and the layer-by-layer
path, eagerly and through graph replays (also after larger batches left their data in the
buffers), and the kernel's grid barrier is left at zero."""

from __future__ import annotations

import numpy as np
import pytest

import rose
from models import save_qwen3
from rose import fidelity
from support import cosines


def short_batches(rng: np.random.Generator, count: int, max_sequences: int, max_length: int) -> list:
    """Random batches, each sent three times (eager, capture, replay), big ones first."""
    batches = []
    for _ in range(count):
        lengths = rng.integers(1, max_length, size=int(rng.integers(1, max_sequences)))
        batches.append([rng.integers(0, 30522, size=n).tolist() for n in lengths])
    batches.sort(key=lambda b: -sum(map(len, b)))
    return [b for b in batches for _ in range(3)]


def engine(folder, monkeypatch, decoder: str, graphs: str = "off") -> rose.Engine:
    """An engine of `folder` on the GPU with ROSE_FUSED_DECODER=`decoder` (auto, triton or 0)."""
    monkeypatch.setenv("ROSE_FUSED_DECODER", decoder)
    return rose.Engine(folder, device="cuda", cuda_graphs=graphs, verify=False)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_layers_match_the_reference_and_the_layer_by_layer_path(tmp_path, monkeypatch, bidirectional: bool):
    folder = save_qwen3(tmp_path / "qwen3", "small", bidirectional=bidirectional)
    fused, fused_eager = engine(folder, monkeypatch, "auto", "lazy"), engine(folder, monkeypatch, "auto")
    plain = engine(folder, monkeypatch, "0")
    assert fused.model.fused is not None and plain.model.fused is None
    assert fused.stats()["fused_decoder"]["max_tokens"] == 16 and plain.stats()["fused_decoder"] is None
    assert fused.stats()["fused_decoder"]["kernel"] == "triton"  # the CUDA one does not take these sizes
    rng = np.random.default_rng(5)
    # Batches of 16 tokens or fewer take the kernel (graphs of a 16-token bucket), longer ones the
    # layer-by-layer path.
    batches = short_batches(rng, 8, max_sequences=4, max_length=5) + short_batches(rng, 4, 2, 17)
    batches += short_batches(rng, 2, 3, 20)
    for sequences in batches:
        expected = fidelity.reference(plain, sequences)
        got = fused.embed_ids(sequences)
        worst = {
            "fused vs float32": cosines(got, expected).min(),
            "layer-by-layer vs float32": cosines(plain.embed_ids(sequences), expected).min(),
        }
        assert min(worst.values()) >= 0.999, worst
        assert cosines(got, fused_eager.embed_ids(sequences)).min() >= 0.9999
    assert fused.stats()["cuda_graphs"]["replays"] > 0
    assert any(tokens == 16 for tokens, _ in fused.graphs.graphs) and any(t > 16 for t, _ in fused.graphs.graphs)
    assert not fused.model.fused.barrier.any()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_cuda_decoder_matches_the_reference_and_the_triton_decoder(tmp_path, monkeypatch, bidirectional: bool):
    """At Qwen3-0.6B's widths (two layers), the sizes the CUDA kernel takes."""
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=bidirectional)
    cuda, cuda_eager = engine(folder, monkeypatch, "auto", "lazy"), engine(folder, monkeypatch, "auto")
    triton, plain = engine(folder, monkeypatch, "triton"), engine(folder, monkeypatch, "0")
    assert cuda.stats()["fused_decoder"]["kernel"] == "cuda" and triton.stats()["fused_decoder"]["kernel"] == "triton"
    rng = np.random.default_rng(7)
    batches = short_batches(rng, 8, max_sequences=4, max_length=5) + short_batches(rng, 4, 2, 17)
    for sequences in batches:
        expected = fidelity.reference(plain, sequences)
        got = cuda.embed_ids(sequences)
        worst = {
            "cuda vs float32": cosines(got, expected).min(),
            "cuda vs triton": cosines(got, triton.embed_ids(sequences)).min(),
            "cuda vs layer-by-layer": cosines(got, plain.embed_ids(sequences)).min(),
        }
        assert min(worst.values()) >= 0.999, worst
        assert cosines(got, cuda_eager.embed_ids(sequences)).min() >= 0.9999
    assert cuda.stats()["cuda_graphs"]["replays"] > 0
    assert not cuda.model.fused.barrier.any()


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_the_cuda_decoder_pools_as_the_layer_by_layer_path(tmp_path, monkeypatch, pooling: str):
    """The CUDA kernel norms and pools in its tail: each mode, through graph replays, against the
    layer-by-layer path's norm and rose.pooling.pool."""
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=pooling == "mean")
    monkeypatch.setenv("ROSE_FUSED_DECODER", "auto")
    cuda = rose.Engine(folder, device="cuda", cuda_graphs="lazy", verify=False, pooling=pooling)
    monkeypatch.setenv("ROSE_FUSED_DECODER", "0")
    plain = rose.Engine(folder, device="cuda", verify=False, pooling=pooling)
    assert cuda.stats()["fused_decoder"]["kernel"] == "cuda"
    rng = np.random.default_rng(11)
    for sequences in short_batches(rng, 6, max_sequences=6, max_length=6):
        got, expected = cuda.embed_ids(sequences, normalize=False), plain.embed_ids(sequences, normalize=False)
        assert cosines(got, expected).min() >= 0.999
        assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(expected, axis=1), rtol=0.02)
    assert cuda.stats()["cuda_graphs"]["replays"] > 0
    assert not cuda.model.fused.barrier.any()
