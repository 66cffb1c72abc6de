"""ivy-serve on the GPU, with lazy CUDA graphs: the whole stack over HTTP against
sentence-transformers, while graphs are captured and replayed under concurrent load."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests

import rose
from support import cosines, start_server, varied_texts


def test_served_vectors_match_sentence_transformers_with_lazy_graphs(tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    texts = varied_texts()
    reference = SentenceTransformer(str(rose.default_model_path()), device="cuda").encode(texts)
    server = start_server(tmp_path, "--device", "cuda", "--cuda-graphs", "lazy", "--auto-truncate")
    try:

        def client(i: int) -> float:
            picks = [j % len(texts) for j in range(i, i + 5 * 32, 32)]
            body = {"input": [texts[j] for j in picks]}
            response = requests.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
            assert response.status_code == 200, response.text
            got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
            return float(cosines(got, reference[picks]).min())

        # Three rounds: the buckets' eager runs, their captures, their replays.
        for _ in range(3):
            with ThreadPoolExecutor(16) as pool:
                assert min(pool.map(client, range(32))) >= 0.999
        engine = requests.get(f"{server.url}/info", timeout=10).json()["engine"]
        assert engine["cuda_graphs"]["graphs"] > 0 and engine["fidelity"]["worst_cosine"] >= 0.999
    finally:
        server.stop()
