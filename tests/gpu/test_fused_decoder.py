"""The fused decoders on the GPU (rose.decoder.triton's Triton kernel, rose.decoder.cuda's CUDA
one), picked by `fused_decoder` (--fused-decoder): a Qwen3 whose short batches take them matches
the float32 reference and the layer-by-layer path, eagerly and through graph replays (also after
larger batches left their data in the buffers), and the kernel's grid barrier is left at zero."""

from __future__ import annotations

import numpy as np
import pytest

import rose
from support import cosines, save_qwen3


def short_batches(rng: np.random.Generator, count: int, max_sequences: int, max_length: int) -> list:
    """Random batches, each sent three times (eager, capture, replay), big ones first."""
    batches = []
    for _ in range(count):
        lengths = rng.integers(1, max_length, size=int(rng.integers(1, max_sequences)))
        batches.append([rng.integers(0, 30522, size=n).tolist() for n in lengths])
    batches.sort(key=lambda b: -sum(map(len, b)))
    return [b for b in batches for _ in range(3)]


def engine(folder, decoder: str, graphs: str = "off", **kwargs) -> rose.Engine:
    """An engine of `folder` on the GPU with the fused decoder `decoder` (auto, cuda, triton or off)."""
    return rose.Engine(folder, device="cuda", cuda_graphs=graphs, verify=False, fused_decoder=decoder, **kwargs)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_layers_match_the_reference_and_the_layer_by_layer_path(tmp_path, bidirectional: bool):
    folder = save_qwen3(tmp_path / "qwen3", "small", bidirectional=bidirectional)
    fused, fused_eager = engine(folder, "auto", "lazy"), engine(folder, "auto")
    plain = engine(folder, "off")
    assert fused.decoder is not None and plain.decoder is None
    assert fused.stats()["fused_decoder"]["max_tokens"] == 16 and plain.stats()["fused_decoder"]["kernel"] is None
    assert fused.describe()["fused_decoder"] == "triton" and plain.describe()["fused_decoder"] == "off"
    assert fused.stats()["fused_decoder"]["kernel"] == "triton"  # the CUDA one does not take these sizes
    rng = np.random.default_rng(5)
    # Batches of 16 tokens or fewer take the kernel (graphs of a 16-token bucket), longer ones the
    # layer-by-layer path.
    batches = short_batches(rng, 8, max_sequences=4, max_length=5) + short_batches(rng, 4, 2, 17)
    batches += short_batches(rng, 2, 3, 20)
    for sequences in batches:
        expected = plain.reference(sequences)
        got = fused.embed_ids(sequences)
        worst = {
            "fused vs float32": cosines(got, expected).min(),
            "layer-by-layer vs float32": cosines(plain.embed_ids(sequences), expected).min(),
        }
        assert min(worst.values()) >= 0.999, worst
        assert cosines(got, fused_eager.embed_ids(sequences)).min() >= 0.9999
    assert fused.stats()["cuda_graphs"]["replays"] > 0
    keys = fused.gpu.graphs.graphs
    assert any(tokens == 16 for tokens, _ in keys) and any(tokens > 16 for tokens, _ in keys)
    assert not fused.decoder.barrier.any()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_cuda_decoder_matches_the_reference_and_the_triton_decoder(tmp_path, bidirectional: bool):
    """At Qwen3-0.6B's widths (two layers), the sizes the CUDA kernel takes."""
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=bidirectional)
    cuda, cuda_eager = engine(folder, "auto", "lazy"), engine(folder, "cuda")
    triton, plain = engine(folder, "triton"), engine(folder, "off")
    assert cuda.stats()["fused_decoder"]["kernel"] == "cuda" and triton.stats()["fused_decoder"]["kernel"] == "triton"
    rng = np.random.default_rng(7)
    batches = short_batches(rng, 8, max_sequences=4, max_length=5) + short_batches(rng, 4, 2, 17)
    for sequences in batches:
        expected = plain.reference(sequences)
        got = cuda.embed_ids(sequences)
        worst = {
            "cuda vs float32": cosines(got, expected).min(),
            "cuda vs triton": cosines(got, triton.embed_ids(sequences)).min(),
            "cuda vs layer-by-layer": cosines(got, plain.embed_ids(sequences)).min(),
        }
        assert min(worst.values()) >= 0.999, worst
        assert cosines(got, cuda_eager.embed_ids(sequences)).min() >= 0.9999
    assert cuda.stats()["cuda_graphs"]["replays"] > 0
    assert not cuda.decoder.barrier.any()


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_the_cuda_decoder_pools_as_the_layer_by_layer_path(tmp_path, pooling: str):
    """The CUDA kernel norms and pools in its tail: each mode, through graph replays, against the
    layer-by-layer path's norm and rose.models.pooling.pool."""
    folder = save_qwen3(tmp_path / "qwen3", "0.6b-2l", bidirectional=pooling == "mean")
    cuda = engine(folder, "cuda", "lazy", pooling=pooling)
    plain = engine(folder, "off", "lazy", pooling=pooling)
    assert cuda.stats()["fused_decoder"]["kernel"] == "cuda"
    rng = np.random.default_rng(11)
    for sequences in short_batches(rng, 6, max_sequences=6, max_length=6):
        got, expected = cuda.embed_ids(sequences), plain.embed_ids(sequences)
        assert cosines(got, expected).min() >= 0.999
        assert np.allclose(np.linalg.norm(got, axis=1), np.linalg.norm(expected, axis=1), rtol=0.02)
    assert cuda.stats()["cuda_graphs"]["replays"] > 0
    assert not cuda.decoder.barrier.any()
