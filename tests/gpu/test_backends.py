"""ROSE on the GPU, every attention backend: each sequence's vector against Hugging Face
transformers in float32 on the same weights (cosine >= 0.999), for Qwen3 at the
Qwen3-Embedding-0.6B shape (random weights) in both kinds and for MiniLM with its real weights."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import rose
from models import save_qwen3, transformers_pooled
from rose import kernels
from rose.attention import BACKENDS, BackendUnavailable
from support import cosines, varied_texts

GPU_BACKENDS = ["fa2", "fa3", "fa4", "torch"]
THRESHOLD = 0.999


def mixed_sequences(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 7, 31, 64, 127, 128, 129, 255, 512] + [rng.randint(8, 512) for _ in range(count - 10)]
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def with_backend(engine: rose.Engine, name: str) -> rose.Engine:
    try:
        engine.use_attention(name)
    except BackendUnavailable as why:
        pytest.fail(f"{name} should load on this GPU: {why}")
    return engine


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "bidirectional"])
def qwen3(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[rose.Engine, list, np.ndarray]:
    folder = save_qwen3(tmp_path_factory.mktemp("qwen3") / "qwen3-0.6b", "0.6b", request.param)
    sequences = mixed_sequences(24, 151669)
    expected = transformers_pooled(folder, sequences, device="cuda").numpy()
    torch.cuda.empty_cache()
    return rose.Engine(folder, device="cuda"), sequences, expected


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_qwen3_06b_shape_matches_transformers(qwen3: tuple, backend: str) -> None:
    engine, sequences, expected = qwen3
    assert engine.dtype == torch.bfloat16
    vectors = with_backend(engine, backend).embed_ids(sequences, normalize=False)
    sims = cosines(vectors, expected)
    assert sims.min() >= THRESHOLD, f"{backend}: worst sequence of {len(sequences[sims.argmin()])} tokens: {sims.min()}"


@pytest.fixture(scope="module")
def minilm() -> tuple[rose.Engine, list[str], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    texts = varied_texts()
    reference = SentenceTransformer(str(rose.default_model_path()), device="cuda").encode(texts)
    return rose.Engine(device="cuda"), texts, reference


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_minilm_head_dim_32_matches_sentence_transformers(minilm: tuple, backend: str) -> None:
    engine, texts, reference = minilm
    vectors = with_backend(engine, backend).encode(texts)
    assert cosines(vectors, reference).min() >= THRESHOLD


def test_auto_loads_every_backend_and_picks_one_per_batch(minilm: tuple) -> None:
    engine, texts, reference = minilm
    engine.use_attention("auto")
    assert set(engine.attention.backends) == set(GPU_BACKENDS)
    assert cosines(engine.encode(texts), reference).min() >= THRESHOLD


def test_a_backend_that_cannot_load_says_why() -> None:
    spec = rose.attention.AttentionSpec(4, 4, 64, causal=False, dtype=torch.float32)
    with pytest.raises(BackendUnavailable, match="float16 or bfloat16"):
        BACKENDS["fa4"](spec, torch.device("cuda"))
    with pytest.raises(BackendUnavailable, match="CUDA GPU"):
        BACKENDS["fa2"](dataclasses.replace(spec, dtype=torch.bfloat16), torch.device("cpu"))


def test_flashinfer_kernels_match_the_torch_reference() -> None:
    fi = kernels.flashinfer()
    assert fi is not None, "FlashInfer should be installed on the GPU machine"
    torch.manual_seed(0)
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.rand(1024, device="cuda", dtype=torch.bfloat16) + 0.5
    cpu = lambda t: t.float().cpu()  # noqa: E731

    def on_cpu(fn, *args):  # the torch path of the same kernel, in float32 on the CPU
        return fn(*[cpu(a) if isinstance(a, torch.Tensor) else a for a in args])

    torch.testing.assert_close(
        cpu(kernels.rmsnorm(x, weight, 1e-6)), on_cpu(kernels.rmsnorm, x, weight, 1e-6), atol=3e-2, rtol=2e-2
    )
    ref_residual, ref_x = cpu(residual), cpu(x)
    expected = kernels.add_rmsnorm(ref_x, ref_residual, cpu(weight), 1e-6)
    got = kernels.add_rmsnorm(x.clone(), residual, weight, 1e-6)
    torch.testing.assert_close(cpu(got), expected, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(cpu(residual), ref_residual, atol=3e-2, rtol=2e-2)
    gu = torch.randn(300, 2 * 3072, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(cpu(kernels.silu_and_mul(gu)), on_cpu(kernels.silu_and_mul, gu), atol=3e-2, rtol=2e-2)
    q = torch.randn(300, 16, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, 512, (300,), device="cuda", dtype=torch.int32)
    cache = kernels.rope_cache(128, 1024, 1e6, torch.device("cuda"))
    rq, rk = cpu(q), cpu(k)
    kernels.apply_rope(rq, rk, positions.cpu(), cache.cpu())
    kernels.apply_rope(q, k, positions, cache)
    torch.testing.assert_close(cpu(q), rq, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(cpu(k), rk, atol=3e-2, rtol=2e-2)
