"""The kernel lab's shared part: a random Qwen3-0.6B-shape engine on the GPU whose CUDA decoder
launches compiled variants of rose's decoder_kernel.cu, for timing experiments.

Variants are timing copies of the shipped kernel: `variants.patch` adds macros to it (its header
lists them). Make the copy here, then carry it to the H200 with the wheel:

    patch -s -o .gpu/lab.cu python/rose/decoder_kernel.cu benches/kernel_lab/variants.patch

The lab swaps the decoder's loaded function, its launch width and shared memory in place (private
attributes of rose.cuda_decoder): a harness for experiments, not an API."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))

import rose  # noqa: E402
from rose import cuda_decoder, decoder_build, nvrtc  # noqa: E402
from rose.batch import RaggedBatch  # noqa: E402

PAIR_SHARED = 48 * 1024
"""The dynamic shared memory PAIR=1 adds: the down phase's exchanged half of its A operand."""

_REQUIRED_CLUSTER_WIDTH = 11  # CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH (0: no clusters)


class _LaunchConfig(ctypes.Structure):
    """The driver's CUlaunchConfig, for cuOccupancyMaxActiveClusters."""

    _fields_ = [
        *((name, ctypes.c_uint) for name in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shared")),
        ("stream", ctypes.c_void_p),
        ("attributes", ctypes.c_void_p),
        ("attribute_count", ctypes.c_uint),
    ]


@dataclass
class Variant:
    """A compiled kernel and how to launch it."""

    function: int
    threads: int
    shared: int


class Lab:
    """The engine of `folder` (a random Qwen3-0.6B shape is saved there first if it is empty) and
    one 16-token query."""

    def __init__(self, folder: Path) -> None:
        if not (folder / "config.json").exists():
            from models import save_qwen3

            save_qwen3(folder, "0.6b", bidirectional=False)
        engine = rose.Engine(folder, device="cuda", cuda_graphs="off", verify=False, attention_backend="sdpa")
        self.model = engine.model
        self.decoder = self.model.fused
        if not isinstance(self.decoder, cuda_decoder.CudaDecoder):
            raise SystemExit(f"the CUDA decoder does not serve this model here ({type(self.decoder)})")
        spec, first = self.model.attention_spec, self.model.layers[0]
        sizes = (self.decoder.hidden, first.down.weight.shape[1], spec.num_heads, spec.num_kv_heads, spec.head_dim)
        self.options = decoder_build.kernel_options(*sizes, len(self.model.layers), spec.causal, False)
        # Taken before any run: run() sets the module's launch width to the variant's.
        self.base_shared, self.base_threads = self.decoder.shared, cuda_decoder._THREADS
        ids = np.random.default_rng(0).integers(1000, 20000, size=16, dtype=np.int32)
        self.batch = RaggedBatch.from_host(ids, np.array([0, 16], dtype=np.int32), torch.device("cuda"))

    def compile(self, source: str, macros: list[str]) -> Variant:
        """`source`: a .cu path, or "ship" for rose's own kernel; `macros`: NAME=VALUE."""
        text = nvrtc.source("decoder_kernel.cu") if source == "ship" else Path(source).read_text()
        values = dict(macro.split("=") for macro in macros)
        cubin = nvrtc.compile_cubin(text, "lab", 90, self.options + [f"-D{macro}" for macro in macros])
        shared = self.base_shared + (PAIR_SHARED if int(values.get("PAIR", 0)) else 0) + int(values.get("EXTRA", 0))
        threads = self.base_threads + 32 * int(values.get("POLLW", 0))
        variant = Variant(self.decoder._driver.load_function(cubin, "decoder_layers", shared), threads, shared)
        self._check_resident(variant)
        return variant

    def _check_resident(self, variant: Variant) -> None:
        """Exits unless every block of a variant in clusters can be resident at once: otherwise its
        grid barrier would never open."""
        driver, function = self.decoder._driver, ctypes.c_void_p(variant.function)
        width, clusters = ctypes.c_int(), ctypes.c_int()
        driver._call("cuFuncGetAttribute", ctypes.byref(width), _REQUIRED_CLUSTER_WIDTH, function)
        if width.value == 0:
            return  # one block an SM, as rose.decoder_build.fits() checks for the shipped kernel
        config = _LaunchConfig(self.decoder.programs, 1, 1, variant.threads, 1, 1, variant.shared, None, None, 0)
        driver._call("cuOccupancyMaxActiveClusters", ctypes.byref(clusters), function, ctypes.byref(config))
        resident = clusters.value * width.value
        print(f"{clusters.value} clusters of {width.value} resident at once: {resident} blocks", flush=True)
        if resident < self.decoder.programs:
            raise SystemExit(f"fewer than the {self.decoder.programs} blocks: the grid barrier would never open")

    def run(self, variant: Variant) -> torch.Tensor:
        """One launch of `variant` for the query; its pooled vector."""
        self.decoder._function, self.decoder.shared = variant.function, variant.shared
        cuda_decoder._THREADS = variant.threads
        return self.decoder(self.batch, self.model.embed_tokens, self.model.rope, self.model.norm, "last")

    def milliseconds(self, variant: Variant, launches: int = 20) -> float:
        """A launch's time, from `launches` back to back between two CUDA events (after 3 more)."""
        for _ in range(3):
            self.run(variant)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            self.run(variant)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / launches

    def scratch(self, index: int) -> torch.Tensor:
        """The decoder's scratch tensor `index` (2: the MLP's activation, where STAMPS=1 writes)."""
        return self.decoder._scratch[index]
