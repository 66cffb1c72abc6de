"""rose.cuda_decoder without a GPU: which sizes the CUDA decoder takes, and that NVRTC (torch's
CUDA wheels carry it) compiles decoder_kernel.cu for Hopper at Qwen3-0.6B's sizes, in bfloat16
and float16. Its arithmetic is checked on the GPU (tests/gpu/test_fused_decoder.py)."""

from __future__ import annotations

import pytest

from rose import cuda_decoder, nvrtc

QWEN3_0_6B = dict(hidden=1024, inter=3072, heads=16, kv_heads=8, head_dim=128)


def test_it_takes_qwen3_0_6b_on_an_h100_or_h200_only() -> None:
    assert cuda_decoder.fits(**QWEN3_0_6B, sms=132)  # H200, H100 SXM
    assert not cuda_decoder.fits(**QWEN3_0_6B, sms=114)  # H100 PCIe: 128 blocks would not all be resident
    qwen3_1_7b = dict(hidden=2048, inter=6144, heads=16, kv_heads=8, head_dim=128)
    small = dict(hidden=256, inter=768, heads=4, kv_heads=2, head_dim=64)
    assert not cuda_decoder.fits(**qwen3_1_7b, sms=132) and not cuda_decoder.fits(**small, sms=132)
    assert cuda_decoder.shared_bytes(**QWEN3_0_6B) <= 227 * 1024


@pytest.mark.parametrize("fp16", [0, 1])
def test_the_kernel_compiles_for_hopper_once(fp16: int, tmp_path, monkeypatch) -> None:
    try:
        nvrtc._library()
    except (nvrtc.NvrtcError, OSError):
        pytest.skip("no NVRTC here (a CPU-only torch)")
    monkeypatch.setenv("ROSE_CACHE_DIR", str(tmp_path))
    options = cuda_decoder.kernel_options(**QWEN3_0_6B, layers=28, causal=True, fp16=bool(fp16))
    source = nvrtc.source("decoder_kernel.cu")
    cubin = nvrtc.compile_cubin(source, "decoder_kernel", 90, options)
    assert cubin[:4] == b"\x7fELF" and len(list(tmp_path.glob("nvrtc/decoder_kernel-*.cubin"))) == 1
    # A later start reads it back instead of compiling (and of loading NVRTC).
    monkeypatch.setattr(nvrtc, "_compile", lambda *args: pytest.fail("compiled again"))
    assert nvrtc.compile_cubin(source, "decoder_kernel", 90, options) == cubin
