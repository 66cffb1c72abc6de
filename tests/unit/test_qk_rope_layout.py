"""The fused QK-norm and RoPE's layout (rose.ops.fused_qk_rope) on the CPU: its arithmetic in
torch, on the pair-ordered weight copy and per-column vectors FusedQkv makes, is ROSE's unfused
QKV product, QK-norm and NeoX RoPE up to the pair order, at positions far along a long document.
quack's kernel is checked against the same arithmetic on the GPU (tests/gpu/test_fused_qk_rope.py)."""

from __future__ import annotations

import torch

from rose.ops import kernels
from rose.ops.fused_qk_rope import FusedQkv, QkvShape, pair_order, paired, reference

SHAPE = QkvShape(heads=4, kv_heads=2, head_dim=128, hidden=96, eps=1e-6)


def test_pair_order() -> None:
    assert pair_order(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert paired(torch.arange(16.0), 8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def test_it_is_the_unfused_path_in_pair_order() -> None:
    torch.manual_seed(0)
    weight = torch.randn(SHAPE.rows, SHAPE.hidden) * SHAPE.hidden**-0.5
    q_norm, k_norm = 1 + 0.3 * torch.randn(2, SHAPE.head_dim)
    x = torch.randn(64, SHAPE.hidden)
    positions = torch.cat([torch.arange(32), torch.randint(0, 32768, (32,))]).int()
    theta = 1e6
    fused = FusedQkv(lambda *args: reference(*args, SHAPE), SHAPE, kernels.rope_inv_freq(SHAPE.head_dim, theta),
                     [(weight, q_norm, k_norm)])  # fmt: skip
    got = fused(0, x, positions.float())

    qkv = x @ weight.t()
    cache = kernels.rope_cache(SHAPE.head_dim, 32768, theta, x.device)
    q, k = kernels.qk_norm_rope(qkv, q_norm, k_norm, SHAPE.eps, positions, cache, SHAPE.heads, SHAPE.kv_heads)
    back = torch.argsort(pair_order(SHAPE.head_dim))
    unpaired = got.unflatten(1, (-1, SHAPE.head_dim))[:, :, back]
    # Far along, ROSE's table (as transformers') rounds each angle to float32, ~2e-3 at 30,000
    # tokens; the fused product's angle is exact to far beyond. Near the start both are exact.
    for near, atol in ((slice(0, 32), 1e-5), (slice(32, None), 5e-3)):
        torch.testing.assert_close(unpaired[near, : SHAPE.heads], q[near], rtol=0, atol=atol)
        torch.testing.assert_close(unpaired[near, SHAPE.heads : -SHAPE.kv_heads], k[near], rtol=0, atol=atol)
    torch.testing.assert_close(got[:, SHAPE.qk_rows :], qkv[:, SHAPE.qk_rows :])  # v as the product made it
    # Attention's scores are the unfused path's.
    q_pairs = got[:, : SHAPE.heads * SHAPE.head_dim].unflatten(1, (-1, SHAPE.head_dim))
    torch.testing.assert_close(q_pairs @ q_pairs.transpose(1, 2), q @ q.transpose(1, 2), rtol=0, atol=0.05)
