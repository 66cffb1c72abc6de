"""ROSE's Triton kernels compile for Hopper (sm_90) here, without a GPU: Triton's interpreter
(test_triton_kernels.py) runs their arithmetic but not the compiler, which refuses code that
Python accepts (a loop variable changing type, a defaulted constexpr argument)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from rose.decoder import triton as triton_decoder  # noqa: E402
from rose.ops import triton_kernels  # noqa: E402

BF16, I32, F32 = "*bf16", "*i32", "*fp32"


def compile_for_hopper(fn: object, pointers: dict[str, str], constants: dict[str, object], warps: int) -> None:
    signature = {**pointers, **{name: "constexpr" for name in constants}}
    constexprs = {(fn.arg_names.index(name),): value for name, value in constants.items()}
    options = {"num_warps": warps, "enable_fp_fusion": True}  # Triton's default, said out loud (3.9 warns)
    triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32), options=options)


def test_the_fused_decoder_compiles_at_qwen3_0_6b_shape() -> None:
    pointers = dict.fromkeys(triton_decoder._decoder_kernel.arg_names[:18], BF16)
    pointers |= {"x_ptr": F32, "count_ptr": I32, "positions_ptr": I32, "seq_ptr": "*i64", "rope_ptr": F32,
                 "barrier_ptr": I32, "eps": "fp32", "scale": "fp32"}  # fmt: skip
    constants = dict(NUM_LAYERS=28, HIDDEN=1024, INTER=3072, HQ=16, HK=8, HALF=64, CAUSAL=True, QKV_COLS=32,
                     QKV_TILE=32, O_COLS=128, GU_COLS=24, GU_TILE=32, DOWN_COLS=16, DOWN_TILE=16, DOWN_SPLIT=2,
                     BK=256, GRID=128)  # fmt: skip
    compile_for_hopper(triton_decoder._decoder_kernel, pointers, constants, 8)


def test_the_attention_kernels_compile() -> None:
    pointers = {"qkv_ptr": BF16, "q_weight_ptr": BF16, "k_weight_ptr": BF16, "positions_ptr": I32, "cache_ptr": F32,
                "seq_ptr": "*i64", "out_ptr": BF16, "T": "i32", "row_stride": "i32", "eps": "fp32",
                "scale": "fp32"}  # fmt: skip
    constants = dict(H=16, HK=8, HALF=64, CAUSAL=True, BLOCK_T=64)
    compile_for_hopper(triton_kernels._norm_rope_attention_kernel, pointers, constants, 4)
    pointers = {"qkv_ptr": BF16, "q_ptr": BF16, "k_ptr": BF16, "q_weight_ptr": BF16, "k_weight_ptr": BF16,
                "positions_ptr": I32, "cache_ptr": F32, "row_stride": "i32", "eps": "fp32"}  # fmt: skip
    compile_for_hopper(triton_kernels._qk_norm_rope, pointers, dict(HQ=16, HK=8, BLOCK_Q=16, BLOCK_K=8, HALF=64), 4)
