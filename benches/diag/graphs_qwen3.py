"""Diagnostic (GPU): graph replay against eager runs for tiny Qwen3 per backend and kernel
setting, then MiniLM served by ivy-serve with lazy graphs (stacks dumped on a hang)."""

import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, "tests")
import rose  # noqa: E402
from models import save_qwen3  # noqa: E402
from rose import kernels  # noqa: E402
from support import cosines, start_server  # noqa: E402

work = Path(tempfile.mkdtemp())
rng = np.random.default_rng(3)
batches = []
for _ in range(4):
    n = int(rng.integers(1, 40))
    batches.append([rng.integers(0, 30522, size=int(x)).tolist() for x in rng.integers(1, 256, size=n)])
batches.sort(key=lambda b: -sum(map(len, b)))
fast = kernels._fast
for bidirectional in (False, True):
    folder = save_qwen3(work / f"q{bidirectional}", "tiny", bidirectional=bidirectional)
    for backend, setting in [("fa2", "default"), ("fa4", "default"), ("torch", "default"), ("torch", "no-pdl"),
                             ("torch", "torch-kernels"), ("fa3", "torch-kernels")]:  # fmt: skip
        kernels.ENABLE_PDL = False if setting == "no-pdl" else None
        kernels._fast = (lambda x: None) if setting == "torch-kernels" else fast
        try:
            g = rose.Engine(folder, device="cuda", attention_backend=backend, cuda_graphs="lazy", verify=False)
            e = rose.Engine(folder, device="cuda", attention_backend=backend, cuda_graphs="off", verify=False)
            worst, bad = 1.0, set()
            for b in batches:
                for _ in range(3):
                    c = cosines(g.embed_ids(b), e.embed_ids(b))
                    worst = min(worst, float(c.min()))
                    bad |= {len(b[i]) for i in np.where(c < 0.9999)[0]}
            print(f"bidir={bidirectional} {backend:5} {setting:13}: worst {worst:.6f} bad lengths {sorted(bad)[:10]}")
        except Exception as ex:
            print(f"bidir={bidirectional} {backend:5} {setting:13}: ERROR {type(ex).__name__}: {str(ex)[:160]}")
kernels.ENABLE_PDL, kernels._fast = None, fast
server = start_server(work, "--device", "cuda", "--cuda-graphs", "lazy")
try:
    for i in range(24):
        body = {"input": [[1000 + j for j in range(16)]] * (1 + i % 8)}
        t = time.perf_counter()
        r = requests.post(f"{server.url}/v1/embeddings", json=body, timeout=20)
        print("http", i, r.status_code, f"{(time.perf_counter() - t) * 1000:.1f} ms", flush=True)
except Exception as ex:
    print("HTTP ERROR", type(ex).__name__, ex)
    server.process.send_signal(signal.SIGUSR1)
    time.sleep(3)
finally:
    server.stop()
    print(server.log.read_text()[-6000:])
