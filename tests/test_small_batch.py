"""rose.small_batch's Triton kernels against the torch reference: each kernel alone, and a whole
Qwen3 model through them against its usual path. Without a GPU, Triton's interpreter runs them
on the CPU; on the H200 they run compiled."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import save_qwen3
from rose import kernels
from rose.attention import create_backend
from rose.batch import RaggedBatch
from rose.model_dir import ModelDir
from rose.models.qwen3 import Qwen3
from rose.weights import load_weights

pytest.importorskip("triton")
# Triton's interpreter mishandles bfloat16 (values off by 1e10), so the CPU runs float16.
DTYPE = torch.bfloat16 if torch.cuda.is_available() else torch.float16
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def small_batch() -> ModuleType:
    """rose.small_batch: compiled on a GPU, in Triton's interpreter elsewhere (tests/conftest.py)."""
    from rose import small_batch

    return small_batch


def cosine_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.float().flatten(1), b.float().flatten(1), dim=1)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(DEVICE, DTYPE)


@pytest.mark.parametrize("tokens", [1, 16, 37, 64])
def test_fused_linears_match_torch(small_batch: ModuleType, tokens: int) -> None:
    x, norm = randn(tokens, 64), randn(64).abs() + 0.5
    weight, gate_up, down = randn(96, 64) / 8, randn(256, 64) / 8, randn(64, 128) / 8
    h = kernels.rmsnorm(x, norm, 1e-6)
    assert cosine_rows(small_batch.norm_linear(x, norm, 1e-6, weight), F.linear(h, weight)).min() > 0.9999
    expected = kernels.silu_and_mul(F.linear(h, gate_up))
    assert cosine_rows(small_batch.norm_linear_silu_and_mul(x, norm, 1e-6, gate_up), expected).min() > 0.9999
    act, residual = randn(tokens, 128), randn(tokens, 64)
    expected = residual + F.linear(act, down)
    assert cosine_rows(small_batch.linear_add(act, down, residual.clone()), expected).min() > 0.9999


@pytest.mark.parametrize("causal", [True, False])
def test_attention_keeps_sequences_apart(small_batch: ModuleType, causal: bool) -> None:
    lengths = [1, 7, 16, 3, 20]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens, heads, kv_heads, dim = int(cu[-1]), 4, 2, 32
    q, k = randn(tokens, heads, dim), randn(tokens, kv_heads, dim)
    qkv_v = randn(tokens, 3 * kv_heads * dim)  # v as a strided view, as it comes out of the fused projection
    v = qkv_v[:, kv_heads * dim : 2 * kv_heads * dim].view(tokens, kv_heads, dim)
    batch = RaggedBatch.from_host(np.zeros(tokens, dtype=np.int32), cu, DEVICE)
    out = small_batch.attention(q, k, v, batch.seq_ids, causal, dim**-0.5).view(tokens, heads, dim)
    for start, end in zip(cu[:-1], cu[1:], strict=True):
        expected = F.scaled_dot_product_attention(
            *(t[start:end].transpose(0, 1).float() for t in (q, k, v)), is_causal=causal, enable_gqa=True
        ).transpose(0, 1)
        assert cosine_rows(out[start:end], expected).min() > 0.999


@pytest.mark.parametrize("bidirectional", [False, True])
def test_qwen3_through_the_small_batch_kernels(small_batch: ModuleType, tmp_path: Path, bidirectional: bool) -> None:
    folder = save_qwen3(tmp_path / "qwen3", "tiny", bidirectional=bidirectional)
    config = ModelDir.open(folder).config
    model = Qwen3(config, load_weights(folder, Qwen3.weight_prefixes), DTYPE, DEVICE)
    lengths = [5, 16, 1, 30]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = np.random.default_rng(0).integers(0, 30522, size=int(cu[-1]), dtype=np.int32)
    batch = RaggedBatch.from_host(ids, cu, DEVICE)
    attention = create_backend("sdpa", model.attention_spec, DEVICE)
    attention.plan(batch)
    model.small_batch = None  # the usual path: torch's kernels on the CPU, FlashInfer's on the GPU
    expected = model.forward(batch, attention)
    model.small_batch = small_batch
    assert cosine_rows(model.forward(batch, attention), expected).min() > 0.999
