"""The "triton" attention backend's kernel (small batches, the whole packed batch in one launch)
against torch's SDPA one sequence at a time. Without a GPU, Triton's interpreter runs it on the
CPU (tests/conftest.py); on the H200 it runs compiled, and tests/gpu/test_graphs.py sends short
batches through it inside whole models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rose.batch import RaggedBatch

triton_kernels = pytest.importorskip("rose.triton_kernels")
# Triton's interpreter mishandles bfloat16 (values off by 1e10), so the CPU runs float16.
DTYPE = torch.bfloat16 if torch.cuda.is_available() else torch.float16
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(DEVICE, DTYPE)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [[1], [16], [1, 7, 16, 3, 20], [40, 24]])
def test_attention_keeps_sequences_apart(causal: bool, lengths: list[int]) -> None:
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens, heads, kv_heads, dim = int(cu[-1]), 4, 2, 32
    q, k = randn(tokens, heads, dim), randn(tokens, kv_heads, dim)
    qkv_v = randn(tokens, 3 * kv_heads * dim)  # v as a strided view, as it comes out of the fused projection
    v = qkv_v[:, kv_heads * dim : 2 * kv_heads * dim].view(tokens, kv_heads, dim)
    batch = RaggedBatch.from_host(np.zeros(tokens, dtype=np.int32), cu, DEVICE)
    out = triton_kernels.small_batch_attention(q, k, v, batch.seq_ids, causal, dim**-0.5).view(tokens, heads, dim)
    for start, end in zip(cu[:-1], cu[1:], strict=True):
        expected = F.scaled_dot_product_attention(
            *(t[start:end].transpose(0, 1).float() for t in (q, k, v)), is_causal=causal, enable_gqa=True
        ).transpose(0, 1)
        cosine = F.cosine_similarity(out[start:end].float().flatten(1), expected.flatten(1), dim=1)
        assert cosine.min() > 0.999, (start, end)
