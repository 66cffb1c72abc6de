"""Start-up work a server does on threads while its main thread imports torch.

`import torch` takes a second or two; after it the engine used to create the CUDA context and copy
the weights onto the GPU through safetensors' pageable copies. Neither needs torch: the driver's
calls made through ctypes and the file reads let go of the GIL, so both run while torch imports.
torch then finds the device's primary context (the one its runtime uses) already made, and
rose.loading.weights takes the staged weights (`take_staged`). Triton's cache key
(rose.loading.triton_key) is hashed here too, but only on a start that has none stored: hashing
beside the import slowed it. So is the CUDA decoder's kernel compiled (rose.decoder.cuda_build), on
a start whose cache has no cubin for it, where the engine will take that decoder (rose.decoder.choose).
Nothing here imports torch."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from rose import decoder
from rose.decoder import cuda_build
from rose.loading import triton_key
from rose.loading.model_dir import model_root, weight_files
from rose.loading.staging import StagedFile, stage
from rose.runtime.cuda_driver import CudaDriver, CudaError, driver_for

log = logging.getLogger(__name__)
_triton_lock = threading.Lock()
_triton_ready = False
# What start() staged, on which GPU, with the driver that owns the buffers; taken once.
_staging: tuple[int, Future[tuple[CudaDriver, list[StagedFile]] | None]] | None = None


def device_index(device: str) -> int | None:
    """The CUDA ordinal a --device value names, or None for the CPU. "auto" is GPU 0 if any."""
    device = device.strip().lower()
    if device in ("auto", "cuda", "gpu"):
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    return None


def start(
    device: str, model: str | Path | None = None, dtype: str = "auto", fused_decoder: str = "auto"
) -> threading.Thread | None:
    """Starts, on daemon threads: `device`'s primary CUDA context and copying the weights of the
    `model` folder (None: the default model) onto it (the thread returned), Triton's key, and the
    CUDA decoder's kernel where the engine will take it (`dtype`, `fused_decoder`: the engine's).
    Does nothing for the CPU, and quietly nothing without a CUDA driver or device (torch reports
    those)."""
    global _staging
    index = device_index(device)
    if index is None:
        return None
    future: Future[tuple[CudaDriver, list[StagedFile]] | None] = Future()
    _staging = index, future
    args = (index, model, dtype, fused_decoder, future)
    thread = threading.Thread(target=_prepare, args=args, name="rose-prestart", daemon=True)
    thread.start()
    return thread


def take_staged(files: list[Path], index: int) -> tuple[CudaDriver | None, dict[Path, StagedFile]]:
    """The files of `files` that start() copied onto GPU `index`, once they are all there, with
    the driver to free them by (`release`); nothing if it copied none of them. Staged buffers
    that are not asked for are freed here."""
    global _staging
    if _staging is None:
        return None, {}
    (staged_on, future), _staging = _staging, None
    try:
        result = future.result()
    except Exception as why:  # noqa: BLE001 - the engine reads the files itself
        log.info("the weights were not staged on the GPU: %s", why)
        return None, {}
    if result is None:
        return None, {}
    driver, staged = result
    asked = set(files) if staged_on == index else set()
    wanted = {s.path: s for s in staged if s.path in asked}
    release(driver, [s for s in staged if s.path not in wanted])
    return driver, wanted


def release(driver: CudaDriver, staged: list[StagedFile]) -> None:
    """Frees staged buffers; call once nothing reads them any more."""
    driver.make_current()
    for file in staged:
        driver.free(file.pointer)


def warm_triton() -> None:
    """Makes Triton's cache key known now (once per process; rose.loading.triton_key: read from disk when
    stored, else hashed and stored), so that the first kernel does not wait for it. A second
    caller waits for the first instead of hashing again."""
    global _triton_ready
    with _triton_lock:
        if _triton_ready:
            return
        try:
            triton_key.install(triton_key.installed_fingerprint())
        except ImportError:
            return
        _triton_ready = True


def _early_triton() -> None:
    """Beside `import torch`: nothing when Triton's key is stored (importing Triton and hashing
    beside it slowed the import), else the hashing, which the first start cannot avoid."""
    digest = triton_key.installed_fingerprint()
    if digest is None or triton_key.stored_key(digest) is None:
        warm_triton()


def compile_decoder(model: str | Path | None, dtype: str, fused_decoder: str, arch: int, sms: int) -> bool:
    """Compiles the CUDA decoder's kernel for the `model` folder on a GPU of `arch` (90: sm_90)
    with `sms` SMs, as the engine will want it (rose.decoder.choose, rose.decoder.cuda); returns
    whether the engine will take it. Later calls read the cubin from NVRTC's cache."""
    fp16 = _SIXTEEN_BIT.get(dtype)
    sixteen_bit = fp16 is not None
    if arch < 90 or "cuda" not in decoder.choose(fused_decoder, True, sixteen_bit, divmod(arch, 10)):
        return False
    config = json.loads((model_root(model) / "config.json").read_text())
    if config.get("model_type") != "qwen3":
        return False
    sizes = cuda_build.qwen3_sizes(config)
    if not cuda_build.fits(sizes["hidden"], sizes["inter"], sizes["heads"], sizes["kv_heads"], sizes["head_dim"], sms):
        return False
    cuda_build.compile_kernel(**sizes, fp16=bool(fp16), arch=arch)
    return True


# --dtype's 16-bit names on a GPU ("auto" is bfloat16 there), to whether they are float16.
_SIXTEEN_BIT = {"auto": False, "bfloat16": False, "bf16": False, "float16": True, "fp16": True}


def _early_decoder(driver: CudaDriver, model: str | Path | None, dtype: str, fused_decoder: str) -> None:
    try:
        compile_decoder(model, dtype, fused_decoder, driver.arch(), driver.sm_count())
    except Exception as why:  # noqa: BLE001 - the engine compiles it, and says what failed
        log.debug("prestart: the CUDA decoder was not compiled (%s)", why)


def _prepare(
    index: int,
    model: str | Path | None,
    dtype: str,
    fused_decoder: str,
    staged: Future[tuple[CudaDriver, list[StagedFile]] | None],
) -> None:
    try:
        driver = driver_for(index)  # the one the engine will use: the context retained once
    except (OSError, CudaError) as why:
        log.debug("prestart: no CUDA context (%s)", why)
        staged.set_result(None)
        return
    # On threads of their own once there is a GPU: the copies below need not wait for them.
    threading.Thread(target=_early_triton, name="rose-prestart-triton", daemon=True).start()
    threading.Thread(
        target=_early_decoder, args=(driver, model, dtype, fused_decoder), name="rose-prestart-nvrtc", daemon=True
    ).start()
    try:
        files = weight_files(model_root(model))
        staged.set_result((driver, stage(driver, files)) if files else None)
    except BaseException as why:  # noqa: BLE001 - handed to take_staged
        staged.set_exception(why)
