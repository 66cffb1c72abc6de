"""Run with TRITON_INTERPRET=1 (tests/unit/test_triton_kernels.py does): ROSE's Triton kernels against
the torch reference of rose.ops.kernels, on the CPU through Triton's interpreter."""

import numpy as np
import torch
import torch.nn.functional as F

from rose.batch import RaggedBatch
from rose.ops import fp8, kernels, triton_kernels

torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
    x = torch.randn(37, 96, dtype=dtype)
    w = (torch.rand(96) + 0.5).to(dtype)
    torch.testing.assert_close(triton_kernels.rmsnorm(x, w, 1e-6), kernels.rmsnorm(x, w, 1e-6), atol=tol, rtol=tol)
    q3 = torch.randn(37, 6 * 16, dtype=dtype)[:, 16 : 5 * 16].reshape(37, 4, 16)  # a view, as q is
    wq = (torch.rand(16) + 0.5).to(dtype)
    torch.testing.assert_close(triton_kernels.rmsnorm(q3, wq, 1e-6), kernels.rmsnorm(q3, wq, 1e-6), atol=tol, rtol=tol)
    residual, expected_residual = torch.randn_like(x), None
    expected_residual = residual.clone()
    expected = kernels.add_rmsnorm(x.clone(), expected_residual, w, 1e-6)
    got = triton_kernels.add_rmsnorm(x.clone(), residual, w, 1e-6)
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(residual, expected_residual, atol=tol, rtol=tol)
    # BERT's post-norm, LayerNorm(x + residual), at a power-of-two width and another
    for width in (96, 100):
        xs, rs = torch.randn(37, width, dtype=dtype), torch.randn(37, width, dtype=dtype)
        gamma, beta = (torch.rand(width) + 0.5).to(dtype), torch.randn(width, dtype=dtype)
        expected = F.layer_norm((xs.float() + rs.float()), (width,), gamma.float(), beta.float(), 1e-12).to(dtype)
        got = triton_kernels.add_layernorm(xs.clone(), rs, gamma, beta, 1e-12)
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    gu = torch.randn(37, 2 * 1500, dtype=dtype)
    torch.testing.assert_close(triton_kernels.silu_and_mul(gu), kernels.silu_and_mul(gu), atol=tol, rtol=tol)
    q, k = torch.randn(37, 4, 32, dtype=dtype), torch.randn(37, 2, 32, dtype=dtype)
    positions = torch.randint(0, 100, (37,), dtype=torch.int32)
    cache = kernels.rope_cache(32, 128, 1e6, torch.device("cpu"))
    rq, rk = q.clone(), k.clone()
    kernels.apply_rope(rq, rk, positions, cache)
    triton_kernels.apply_rope(q, k, positions, cache)
    torch.testing.assert_close(q, rq, atol=tol, rtol=tol)
    torch.testing.assert_close(k, rk, atol=tol, rtol=tol)
    for head_dim in (16, 128):
        heads, kv_heads = 4, 2
        qkv = torch.randn(37, (heads + 2 * kv_heads) * head_dim + 8, dtype=dtype)[:, 8:]  # strided rows
        wq, wk = (torch.rand(head_dim) + 0.5).to(dtype), (torch.rand(head_dim) + 0.5).to(dtype)
        cache = kernels.rope_cache(head_dim, 128, 1e6, torch.device("cpu"))
        # The reference in float32: the kernel rounds once, a bfloat16 reference after each of its
        # steps, and RoPE's differences can turn those roundings into several units in the last place.
        q32 = qkv[:, : heads * head_dim].float().reshape(37, heads, head_dim)
        k32 = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].float().reshape(37, kv_heads, head_dim)
        eq, ek = kernels.rmsnorm(q32, wq.float(), 1e-6), kernels.rmsnorm(k32, wk.float(), 1e-6)
        kernels.apply_rope(eq, ek, positions, cache)
        assert triton_kernels.fits_qk_norm_rope(head_dim)
        gq, gk = triton_kernels.qk_norm_rope(qkv, wq, wk, 1e-6, positions, cache, heads, kv_heads)
        torch.testing.assert_close(gq, eq.to(dtype), atol=tol, rtol=tol)
        torch.testing.assert_close(gk, ek.to(dtype), atol=tol, rtol=tol)
# small_batch_attention, the whole packed batch in one launch, against SDPA one sequence at a time.
# float16: the interpreter computes bfloat16 dot products wrong (values off by 1e10).
for causal in (True, False):
    for lengths in ([1], [16], [1, 7, 16, 3, 20], [40, 24]):
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens, heads, kv_heads, dim = int(cu[-1]), 4, 2, 32
        q, k = torch.randn(tokens, heads, dim).half(), torch.randn(tokens, kv_heads, dim).half()
        qkv_v = torch.randn(tokens, 3 * kv_heads * dim).half()  # v as a strided view of the fused projection
        v = qkv_v[:, kv_heads * dim : 2 * kv_heads * dim].view(tokens, kv_heads, dim)
        seq_ids = RaggedBatch.from_host(np.zeros(tokens, dtype=np.int32), cu, torch.device("cpu")).seq_ids
        out = triton_kernels.small_batch_attention(q, k, v, seq_ids, causal, dim**-0.5).view(tokens, heads, dim)
        for start, end in zip(cu[:-1], cu[1:], strict=True):
            expected = F.scaled_dot_product_attention(
                *(t[start:end].transpose(0, 1).float() for t in (q, k, v)), is_causal=causal, enable_gqa=True
            ).transpose(0, 1)
            cosine = F.cosine_similarity(out[start:end].float().flatten(1), expected.flatten(1), dim=1)
            assert cosine.min() > 0.999, (causal, lengths, start, end)
# norm_rope_attention, QK-norm, RoPE and attention in one launch, against its two kernels' steps.
for causal in (True, False):
    for lengths in ([1], [1, 7, 16, 3, 20], [40, 24]):
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens, heads, kv_heads, dim = int(cu[-1]), 4, 2, 32
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim + 8).half()[:, 8:]  # strided rows
        wq, wk = (torch.rand(dim) + 0.5).half(), (torch.rand(dim) + 0.5).half()
        batch = RaggedBatch.from_host(np.zeros(tokens, dtype=np.int32), cu, torch.device("cpu"))
        cache = kernels.rope_cache(dim, 128, 1e6, torch.device("cpu"))
        args = (wq, wk, 1e-6, batch.positions, cache)
        q, k = triton_kernels.qk_norm_rope(qkv, *args, heads, kv_heads)
        v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
        expected = triton_kernels.small_batch_attention(q, k, v, batch.seq_ids, causal, dim**-0.5).float()
        got = triton_kernels.norm_rope_attention(qkv, *args, batch.seq_ids, heads, kv_heads, causal, dim**-0.5)
        cosine = F.cosine_similarity(got.float().view(tokens, heads, dim), expected.view(tokens, heads, dim), dim=2)
        assert cosine.min() > 0.9999, (causal, lengths, cosine.min())
# FP8 quantization per token (--dtype fp8): the same scales, the same e4m3 values up to ties.
x = torch.randn(37, 3000 + 8, dtype=torch.bfloat16)[:, 8:] * torch.logspace(-2, 2, 37, dtype=torch.bfloat16)[:, None]
q, scale = triton_kernels.quantize_rows(x)
rq, rscale = fp8.quantize_rows_reference(x)
torch.testing.assert_close(scale, rscale)
# The interpreter's float32 -> e4m3 cast is wrong at some values (128 -> 64, 160 -> 176), so the
# e4m3 values are compared on the GPU only (tests/gpu/test_fp8_matmul.py); here the scales and layout.
assert q.dtype == fp8.FP8 and q.shape == x.shape and q.is_contiguous()
print("triton kernels match")
