"""Run with TRITON_INTERPRET=1 (tests/test_triton_kernels.py does): ROSE's Triton kernels against
the torch reference of rose.kernels, on the CPU through Triton's interpreter."""

import torch

from rose import kernels, triton_kernels

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
        eq = kernels.rmsnorm(qkv[:, : heads * head_dim].reshape(37, heads, head_dim), wq, 1e-6)
        ek = kernels.rmsnorm(
            qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(37, kv_heads, head_dim), wk, 1e-6
        )
        kernels.apply_rope(eq, ek, positions, cache)
        assert triton_kernels.fits_qk_norm_rope(head_dim)
        gq, gk = triton_kernels.qk_norm_rope(qkv, wq, wk, 1e-6, positions, cache, heads, kv_heads)
        torch.testing.assert_close(gq, eq, atol=tol, rtol=tol)
        torch.testing.assert_close(gk, ek, atol=tol, rtol=tol)
print("triton kernels match")
