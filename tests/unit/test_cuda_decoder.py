"""rose.decoder.cuda's kernel without a GPU (rose.decoder.cuda_build): which sizes it takes, that NVRTC
(torch's CUDA wheels carry it) compiles decoder_kernel.cu for Hopper at Qwen3-0.6B's sizes in
bfloat16 and float16, once, and that a server's start compiles it beside the import of torch
(rose.loading.prestart) as the engine will ask for it. Its arithmetic is checked on the GPU
(tests/gpu/test_fused_decoder.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from rose.decoder import cuda_build
from rose.loading import prestart
from rose.runtime import nvrtc

QWEN3_0_6B = dict(hidden=1024, inter=3072, heads=16, kv_heads=8, head_dim=128)
CONFIG_0_6B = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=128, num_hidden_layers=28)  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    try:
        nvrtc._library()
    except (nvrtc.NvrtcError, OSError):
        pytest.skip("no NVRTC here (a CPU-only torch)")
    monkeypatch.setenv("ROSE_CACHE_DIR", str(tmp_path))
    return tmp_path


def cubins(cache: Path) -> list[Path]:
    return list(cache.glob("nvrtc/decoder_kernel-*.cubin"))


def test_it_takes_qwen3_0_6b_on_hopper_with_132_sms_only() -> None:
    assert cuda_build.fits(**QWEN3_0_6B, sms=132)  # H200, H100 SXM
    assert not cuda_build.fits(**QWEN3_0_6B, sms=114)  # H100 PCIe: 128 blocks would not all be resident
    qwen3_1_7b = dict(hidden=2048, inter=6144, heads=16, kv_heads=8, head_dim=128)
    small = dict(hidden=256, inter=768, heads=4, kv_heads=2, head_dim=64)
    assert not cuda_build.fits(**qwen3_1_7b, sms=132) and not cuda_build.fits(**small, sms=132)
    assert cuda_build.shared_bytes(**QWEN3_0_6B) <= 227 * 1024


@pytest.mark.parametrize("fp16", [False, True])
def test_the_kernel_compiles_for_hopper_once(fp16: bool, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cubin = cuda_build.compile_kernel(**QWEN3_0_6B, layers=28, causal=True, fp16=fp16, arch=90)
    assert cubin[:4] == b"\x7fELF" and len(cubins(cache)) == 1
    # A later start reads it back instead of compiling (and of loading NVRTC).
    monkeypatch.setattr(nvrtc, "_compile", lambda *args: pytest.fail("compiled again"))
    assert cuda_build.compile_kernel(**QWEN3_0_6B, layers=28, causal=True, fp16=fp16, arch=90) == cubin


def test_a_second_caller_waits_for_the_compile_under_way(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def slow_compile(*args: object) -> bytes:
        calls.append(args)
        time.sleep(0.3)
        return b"\x7fELF cubin"

    monkeypatch.setattr(nvrtc, "_compile", slow_compile)
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(nvrtc.compile_cubin("src", "k", 90, []))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and got == [b"\x7fELF cubin"] * 3


def test_a_server_start_compiles_what_the_engine_will_ask_for(cache: Path, tmp_path: Path) -> None:
    model = tmp_path / "qwen3"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG_0_6B))
    assert not prestart.compile_decoder(model, "auto", "auto", arch=80, sms=108)  # an A100: no bulk copies
    assert not prestart.compile_decoder(model, "float32", "auto", arch=90, sms=132)
    # --fused-decoder triton or off: the engine will not ask for it.
    assert not prestart.compile_decoder(model, "auto", "triton", arch=90, sms=132)
    assert not prestart.compile_decoder(model, "auto", "off", arch=90, sms=132)
    assert not cubins(cache)
    assert prestart.compile_decoder(model, "auto", "auto", arch=90, sms=132) and len(cubins(cache)) == 1
    # The very cubin that rose.decoder.cuda asks for (bfloat16, causal, 28 layers).
    assert cubins(cache)[0].read_bytes() == cuda_build.compile_kernel(
        **QWEN3_0_6B, layers=28, causal=True, fp16=False, arch=90
    )
    assert len(cubins(cache)) == 1
    (model / "config.json").write_text(json.dumps({**CONFIG_0_6B, "hidden_size": 2048}))
    assert not prestart.compile_decoder(model, "auto", "auto", arch=90, sms=132)
