"""Diagnostic: graph replay vs eager for tiny Qwen3 per backend, and MiniLM served with graphs."""
import sys, time, subprocess, numpy as np, torch, requests
sys.path.insert(0, "tests")
from models import save_qwen3
from support import cosines, start_server
import rose
from pathlib import Path
import tempfile
work = Path(tempfile.mkdtemp())
rng = np.random.default_rng(3)
batches = []
for _ in range(5):
    n = int(rng.integers(1, 40)); batches.append([rng.integers(0, 30522, size=int(l)).tolist() for l in rng.integers(1, 256, size=n)])
batches.sort(key=lambda b: -sum(map(len, b)))
for kind in (False, True):
    folder = save_qwen3(work / f"q{kind}", "tiny", bidirectional=kind)
    for backend in ("fa2", "fa3", "fa4", "torch"):
        try:
            g = rose.Engine(folder, device="cuda", attention_backend=backend, cuda_graphs="lazy", verify=False)
            e = rose.Engine(folder, device="cuda", attention_backend=backend, cuda_graphs="off", verify=False)
            worst = 1.0; bad = []
            for b in batches:
                for _ in range(3):
                    c = cosines(g.embed_ids(b), e.embed_ids(b)); worst = min(worst, c.min())
                    bad += [len(b[i]) for i in np.where(c < 0.9999)[0]]
            print(f"qwen3 tiny bidir={kind} {backend}: worst {worst:.6f}; bad lengths {sorted(set(bad))[:12]}", flush=True)
        except Exception as ex:
            print(f"qwen3 tiny bidir={kind} {backend}: ERROR {type(ex).__name__}: {str(ex)[:200]}", flush=True)
# MiniLM served with lazy graphs
server = start_server(work, "--device", "cuda", "--cuda-graphs", "lazy")
try:
    for i in range(20):
        body = {"input": [[1000 + j for j in range(16)]] * (1 + i % 8)}
        t = time.perf_counter(); r = requests.post(f"{server.url}/v1/embeddings", json=body, timeout=20)
        print("http", i, r.status_code, f"{(time.perf_counter()-t)*1000:.1f} ms", flush=True)
except Exception as ex:
    print("HTTP ERROR", type(ex).__name__, ex)
    import signal; server.process.send_signal(signal.SIGUSR1); time.sleep(2)
finally:
    server.stop()
    print(server.log.read_text()[-3000:])
