"""Helpers of the end-to-end tests: real ivy-serve processes, varied texts, cosine similarity."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests

_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Embedding models map text to vectors so that similar meanings land close together.",
    "A vector database stores millions of embeddings and answers nearest-neighbour queries.",
    "Rain is expected in the afternoon, clearing by the evening with light winds from the west.",
    "She paid 12.50 EUR for two coffees and a croissant at 07:45 on 2024-03-01.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The committee postponed its decision until the budget figures were audited.",
    "In 1969, Apollo 11 landed on the Moon and Neil Armstrong took the first steps.",
]
_SCRIPTS = [
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί.",
    "敏捷的棕色狐狸跳过了懒狗。向量数据库用于相似性搜索。",
    "素早い茶色の狐がのろまな犬を飛び越える。埋め込みモデルのテスト。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "השועל החום המהיר קופץ מעל הכלב העצלן.",
    "สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ",
    "Der schnelle braune Fuchs springt über den faulen Hund. Äpfel, Öl, Übermut, Straße.",
    "Le renard brun rapide saute par-dessus le chien paresseux. Où est l'hôtel ? Ça va.",
]
_EMOJI = ["🙂", "🚀🚀🚀", "I ❤️ embeddings 🤖", "👩‍👩‍👧‍👦 family", "🇯🇵🇫🇷 flags", "✅ done ❌ failed ⚠️ warn"]
_CODE = [
    "def add(a, b):\n    return a + b\n",
    'fn main() { println!("hello {}", 42); }',
    "SELECT id, name FROM users WHERE created_at > NOW() - INTERVAL '7 days';",
    '<div class="card"><a href="https://example.com/?q=1&r=2">link</a></div>',
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; }",
    '$ curl -s localhost:3000/embed -d \'{"inputs": "hi"}\'',
]
_WHITESPACE = [" ", "   ", "\n", "\t\t", " \n \t "]


def varied_texts(count: int = 240, seed: int = 7) -> list[str]:
    """`count` texts covering the cases above, the same every run."""
    rng = random.Random(seed)
    texts = ["a", "Z", "?", "é", "中", "🙂", "ab", "42"]
    texts += _SCRIPTS + _EMOJI + _CODE + _WHITESPACE
    # Past the 256-token limit, in several scripts.
    texts += [" ".join(_SENTENCES) * 4, _SCRIPTS[0] * 20, _SCRIPTS[2] * 30, _CODE[0] * 40, "word " * 600]
    # Right around the limit.
    texts += ["token " * n for n in (250, 253, 254, 255, 256, 257)]
    pool = _SENTENCES + _SCRIPTS + _EMOJI + _CODE
    while len(texts) < count:
        n = rng.choice([1, 1, 2, 3, 5, 8, 13])
        texts.append(" ".join(rng.choice(pool) for _ in range(n)))
    return texts[:count]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running ivy-serve: its HTTP base URL and Tulip's gRPC address."""

    url: str
    grpc: str
    process: subprocess.Popen
    log: Path

    def settle(self, timeout: float = 300) -> None:
        """Waits until the engine has imported the attention backends it left for later, then
        sends one long batch, which switches to them: measurements then see the steady state."""
        deadline = time.monotonic() + timeout
        while requests.get(f"{self.url}/info", timeout=30).json()["engine"].get("attention_importing"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine still imports its attention backends after {timeout} s")
            time.sleep(0.1)
        long_batch = {"input": [[1000 + i for i in range(100)]] * 4}
        requests.post(f"{self.url}/v1/embeddings", json=long_batch, timeout=timeout).raise_for_status()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(log_dir: Path, *args: str, timeout: float = 180) -> Server:
    """Starts `ivy-serve` with `args` on free ports; returns once /health answers 200."""
    port, grpc_port = free_port(), free_port()
    log = log_dir / f"ivy-serve-{port}.log"
    command = ["ivy-serve", "--hostname", "127.0.0.1", "--port", str(port), "--grpc-port", str(grpc_port), *args]
    env = {**os.environ, "DEVICE": os.environ.get("DEVICE", "cpu")}
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}", process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ivy-serve exited with {process.returncode}:\n{log.read_text()}")
        try:
            if requests.get(f"{server.url}/health", timeout=1).status_code == 200:
                return server
        # Ivy takes connections before its Tulip answers, and holds them until it does.
        except (requests.ConnectionError, requests.Timeout):
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"ivy-serve did not become healthy in {timeout} s:\n{log.read_text()}")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `a` with the same row of `b`."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)
