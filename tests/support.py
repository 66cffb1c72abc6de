"""The tests' helpers, in one module: varied texts, real ivy-serve processes, cosine similarity,
random-weight model folders saved as published (config.json, safetensors, sentence-transformers
pooling, all-MiniLM-L6-v2's tokenizer) and their Hugging Face transformers references in float32."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests
import torch
from safetensors.torch import save_file

import rose
from rose.ops.large_steps import LargeStepKernel

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


def free_port_range(count: int, avoid: int) -> int:
    """The first of `count` consecutive free ports, none of them `avoid`: ivy-serve gives its
    workers the ports from --grpc-port on, so a lone free port can clash with the next."""
    while True:
        base = free_port()
        ports = range(base, base + count)
        if avoid in ports or ports.stop > 65536:
            continue
        try:
            for port in ports[1:]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue


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
    port = free_port()
    grpc_port = free_port_range(8, avoid=port)  # room for the workers of several models or replicas
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


@dataclass
class Tulip:
    """A `tulip-serve` process that can be killed, stopped and started again on its address."""

    host: str
    port: int
    log_dir: Path
    args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Tulip:
        command = ["tulip-serve", "--hostname", self.host, "--grpc-port", str(self.port), *self.args]
        env = {**os.environ, "DEVICE": os.environ.get("DEVICE", "cpu")}
        log = (self.log_dir / f"tulip-{self.host}-{self.port}.log").open("a")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def metric(url: str, name: str) -> float:
    """The sum of a server's Prometheus samples whose name starts with `name` (0 before the first)."""
    lines = requests.get(f"{url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(name))


def replica(info: dict, url: str) -> dict:
    """The /info entry of the replica at `url` (KeyError when it is not there)."""
    return {r["url"]: r for r in info["replicas"]}[url]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of `a` with the same row of `b`."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def encode(engine: rose.Engine, texts: Sequence[str]) -> np.ndarray:
    """The engine's pooled vectors of `texts`, tokenized as Ivy tokenizes them (no prompt,
    truncated to the model's limit), in one batch."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(engine.model_dir.tokenizer_json().decode())
    tokenizer.no_padding()
    tokenizer.enable_truncation(engine.max_input_length)
    return engine.embed_ids([e.ids for e in tokenizer.encode_batch(list(texts))])


# Random-weight model folders.

QWEN3_SEQUENCES = [[101, 2023, 2003, 102], [7592], [101] + list(range(2000, 2300)) + [102], [5, 6, 7, 8, 9, 10, 11]]
"""Token ids for the Qwen3 tests: a 1-token input, one longer than a graph bucket, mixed lengths."""

QWEN3_SHAPES = {
    # A few layers for the CPU, with GQA and the tokenizer's 30522 ids.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=30522, max_position_embeddings=1024),
    # Small enough for a test, with the head_dim (64) that the fused decoder takes.
    "small": dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  intermediate_size=768, vocab_size=30522, max_position_embeddings=1024),
    # Qwen3-Embedding-0.6B.
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072, vocab_size=151669, max_position_embeddings=32768),
    # Its widths in two layers: the sizes rose.decoder.cuda takes, quick to write.
    "0.6b-2l": dict(hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
                    head_dim=128, intermediate_size=3072, vocab_size=151669, max_position_embeddings=32768),
}  # fmt: skip


def _finish(folder: Path, model: torch.nn.Module, pooling: str, prefix: str, extra_config: dict) -> None:
    model.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    save_file({prefix + k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **extra_config}, indent=1))
    key = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({key[pooling]: True}))
    (folder / "tokenizer.json").write_bytes((rose.default_model_path() / "tokenizer.json").read_bytes())


def save_tiny_bert(folder: Path, pooling: str, prefix: str = "") -> Path:
    """A random 2-layer BertModel."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    folder.mkdir(parents=True, exist_ok=True)
    _finish(folder, BertModel(config).eval(), pooling, prefix, {})
    return folder


def save_as_sentence_transformer(
    folder: Path,
    base: Path,
    pooling: str,
    max_seq_length: int,
    dense: tuple[int, ...] = (),
    prompts: dict | None = None,
) -> Path:
    """`base` (a transformers folder) saved by sentence-transformers as its published embedders
    are: Transformer, Pooling, Dense modules of widths `dense` (no bias, as EmbeddingGemma's),
    Normalize, with their module folders, configs and `prompts`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    transformer = Transformer(str(base), max_seq_length=max_seq_length)
    dimension = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(dimension, pooling)]
    for width in dense:
        modules.append(Dense(dimension, width, bias=False, activation_function=torch.nn.Identity()))
        dimension = width
    modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(folder))
    return folder


EMBEDDINGGEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}


EMBEDDINGGEMMA = dict(hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1,
                      head_dim=256, query_pre_attn_scalar=256, intermediate_size=1152, sliding_window=512,
                      max_position_embeddings=2048)  # fmt: skip
"""EmbeddingGemma-300m's widths (the benchmark's shape, with Dense 768 -> 3072 -> 768)."""


def save_embeddinggemma(folder: Path, dense: tuple[int, ...] = (256, 64), **sizes: int) -> Path:
    """A random Gemma3TextModel in EmbeddingGemma's form: bidirectional, local layers within a
    window (32 tokens unless `sizes` say) and a global one, QK-norm, GQA, its own score scale; mean
    pooling, two Dense modules (64 -> 256 -> 64 here, 768 -> 3072 -> 768 published), Normalize,
    its prompts."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    torch.manual_seed(6)
    shape = {**dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                    query_pre_attn_scalar=24, intermediate_size=96, max_position_embeddings=1024, sliding_window=32),
             **sizes}  # fmt: skip
    # Every sixth layer global, as published, and the last one (the tests' three layers: two local, one global).
    layers = shape["num_hidden_layers"]
    kinds = ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention" for i in range(layers)]
    config = Gemma3TextConfig(
        **shape, vocab_size=30522, use_bidirectional_attention=True, pad_token_id=0, bos_token_id=101,
        eos_token_id=102, layer_types=kinds,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    )  # fmt: skip
    model = Gemma3TextModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)  # (1 + w): gains of 0.5-1.5
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(10)  # attention that a wrong window or RoPE base would change
    base = folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    _finish(base, model, "mean", "", {})
    # all-MiniLM-L6-v2's tokenizer in place of Gemma's (which no installed package ships).
    tokens = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    tokenizer = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1024, **tokens}
    (base / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return save_as_sentence_transformer(folder, base, "mean", 1024, dense=dense, prompts=EMBEDDINGGEMMA_PROMPTS)


MODERNBERT_SIZES = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                        vocab_size=30522, max_position_embeddings=1024, local_attention=128, pad_token_id=0,
                        bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102)  # fmt: skip
"""A 3-layer ModernBERT (global, local, local) with the published window of 128 tokens and the
all-MiniLM-L6-v2 tokenizer's special ids."""


def _vary_norms(model: torch.nn.Module) -> None:
    """Random init leaves the norms at one and attention near uniform: vary the norms and sharpen
    the attention, so that a misplaced norm, a wrong window or a wrong RoPE base shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            if name.endswith(("Wqkv.weight", "attn.Wo.weight")):
                p.mul_(10)


def save_modernbert(folder: Path, pooling: str) -> Path:
    """A random ModernBertModel saved as gte-modernbert (`cls`) or modernbert-embed (`mean`) are."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(5)
    model = ModernBertModel(ModernBertConfig(**MODERNBERT_SIZES)).eval()
    _vary_norms(model)
    base = folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    _finish(base, model, pooling, "", {})
    return save_as_sentence_transformer(folder, base, pooling, 1024)


MPNET_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
"""all-mpnet-base-v2's widths (the benchmark's shape; the tests' default is tiny)."""


def save_mpnet(folder: Path, **sizes: int) -> Path:
    """A random MPNetModel (2 tiny layers unless `sizes` say) in all-mpnet-base-v2's form (mean
    pooling, Normalize, 384 tokens), its relative position bias made large enough that a wrong
    bucket would show."""
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(3)
    shape = {**dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128), **sizes}
    config = MPNetConfig(**shape, vocab_size=30527, max_position_embeddings=514)
    model = MPNetModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.normal_(0.0, 2.0)
    base = folder.parent / f"{folder.name}-base"
    base.mkdir(parents=True, exist_ok=True)
    _finish(base, model, "mean", "", {})
    return save_as_sentence_transformer(folder, base, "mean", 384)


def save_qwen3(folder: Path, shape: str, bidirectional: bool, prefix: str = "", top_level_rope: bool = False) -> Path:
    """A random Qwen3Model: the Qwen3-Embedding kind (causal, last-token pooling) or, with
    `bidirectional`, the pplx-embed kind (use_bidirectional_attention, mean pooling)."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(2)
    config = Qwen3Config(**QWEN3_SHAPES[shape], rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    model = Qwen3Model(config).eval()
    # Random init leaves the norms at one; vary them so that a misplaced norm shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    if shape.startswith("0.6b"):  # stored in bfloat16, as Qwen3-Embedding-0.6B is published (1.2 GB, not 2.4)
        model = model.to(torch.bfloat16)
    extra: dict = {"use_bidirectional_attention": True} if bidirectional else {}
    if top_level_rope:  # as Qwen3-Embedding's config.json has it
        extra |= {"rope_theta": 1_000_000.0, "rope_parameters": None}
    folder.mkdir(parents=True, exist_ok=True)
    _finish(folder, model, "mean" if bidirectional else "last", prefix, extra)
    return folder


def transformers_pooled(folder: Path, sequences: list[list[int]], device: str = "cpu") -> torch.Tensor:
    """Hugging Face transformers' float32 vectors of `sequences`, one at a time (no padding),
    pooled as the folder says; bidirectional Qwen3 gets an all-visible attention mask."""
    from transformers import AutoModel

    config = json.loads((folder / "config.json").read_text())
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    rows = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device=device)
            mask = None
            if config.get("use_bidirectional_attention"):
                mask = torch.zeros(1, 1, len(seq), len(seq), device=device)
            states = model(input_ids=ids, attention_mask=mask).last_hidden_state[0]
            if pooling.get("pooling_mode_cls_token"):
                rows.append(states[0])
            elif pooling.get("pooling_mode_lasttoken"):
                rows.append(states[-1])
            else:
                rows.append(states.mean(0))
    return torch.stack(rows).float().cpu()


# Score models: cross-encoders and a causal reranker, random weights saved as published.


def save_cross_encoder(folder: Path, family: str = "bert") -> Path:
    """A random sequence classifier with one label: BertForSequenceClassification (the
    ms-marco-MiniLM kind, all-MiniLM-L6-v2's tokenizer), ModernBertForSequenceClassification (the
    gte-reranker-modernbert kind, the same tokenizer) or XLMRobertaForSequenceClassification
    (the bge-reranker kind, the same vocabulary behind RoBERTa's pair template: <s> a </s></s> b </s>)."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    torch.manual_seed(3)
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_labels=1)
    if family == "bert":
        model = BertForSequenceClassification(BertConfig(**sizes))
    elif family == "modernbert":
        from transformers import ModernBertConfig, ModernBertForSequenceClassification

        model = ModernBertForSequenceClassification(ModernBertConfig(**MODERNBERT_SIZES, num_labels=1))
        _vary_norms(model)
    else:
        config = XLMRobertaConfig(**sizes, vocab_size=30522, max_position_embeddings=514, type_vocab_size=1)
        model = XLMRobertaForSequenceClassification(config)
    with torch.no_grad():  # random init leaves the norms at one: vary them so that a misplaced one shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.uniform_(0.5, 1.5)
            if name.startswith("classifier") and name.endswith("weight"):
                p.mul_(40)  # scores spread over (0, 1) rather than all near 0.5, so that the order says something
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder)
    minilm = rose.default_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (folder / name).write_bytes((minilm / name).read_bytes())
    if family == "xlm-roberta":
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        tokenizer["post_processor"] = {"type": "RobertaProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101],
                                       "trim_offsets": True, "add_prefix_space": False}  # fmt: skip
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
        tokens = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, **tokens}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def save_qwen3_reranker(folder: Path, shape: str = "tiny", logit_scale: float | None = None) -> Path:
    """A random Qwen3ForCausalLM in a QWEN3_SHAPES shape, published as Qwen3-Reranker is (a causal
    LM with its LM head; served with --task score), all-MiniLM-L6-v2's tokenizer ("yes" and "no" in
    it). `logit_scale` multiplies the LM head: by default 20 * (64 / hidden) ** 0.5, which spreads
    the scores; a random wide shape's bfloat16 scores stray past 1e-2 of float32 at that spread
    (0.6b-2l: 0.037), so a test that bounds them asks for less."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(4)
    config = Qwen3Config(**QWEN3_SHAPES[shape], tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
        # yes-minus-no logits that spread the scores (the final norm's output grows with the width)
        model.lm_head.weight.mul_(logit_scale or 20 * (64 / config.hidden_size) ** 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes((rose.default_model_path() / "tokenizer.json").read_bytes())
    return folder


def pair_ids(folder: Path, query: str, document: str, max_length: int = 512) -> tuple[list[int], list[int]]:
    """A cross-encoder's pair as its tokenizer.json encodes it (the `tokenizers` package), the
    document shortened to fit `max_length`: ids, types."""
    tokenizer = plain_tokenizer(folder)
    tokenizer.enable_truncation(max_length, strategy="only_second")
    encoding = tokenizer.encode(query, document)
    return encoding.ids, encoding.type_ids


def plain_tokenizer(folder: Path) -> object:
    """The folder's tokenizer.json without the padding and truncation it was published with."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def classifier_logits(folder: Path, pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
    """transformers' AutoModelForSequenceClassification in float32 on each pair's ids and types."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        rows = [
            model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0] for ids, types in pairs
        ]
    return torch.stack(rows).numpy()


def qwen3_reranker_prompts(
    folder: Path, query: str, documents: list[str], instruction: str | None = None
) -> list[list[int]]:
    """Each pair rendered into Qwen3-Reranker's published prompt, the content truncated to fit."""
    from rose.serving.task import QWEN3_RERANKER_TEMPLATE as t

    tokenizer = plain_tokenizer(folder)
    plain = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    prefix, suffix = plain(t["prefix"]), plain(t["suffix"])
    limit = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    rendered = []
    for document in documents:
        content = t["content"].format(
            instruction=instruction or t["default_instruction"], query=query, document=document
        )
        rendered.append(prefix + plain(content)[: limit - len(prefix) - len(suffix)] + suffix)
    return rendered


def qwen3_reranker_scores(folder: Path, query: str, documents: list[str], instruction: str | None = None) -> np.ndarray:
    """Qwen3-Reranker's published scoring, on transformers' Qwen3ForCausalLM in float32: each pair
    rendered into its prompt (`qwen3_reranker_prompts`), sigmoid(logit_yes - logit_no) at the last
    token."""
    from transformers import Qwen3ForCausalLM

    tokenizer = plain_tokenizer(folder)
    yes, no = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    scores = []
    for ids in qwen3_reranker_prompts(folder, query, documents, instruction):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        scores.append(torch.sigmoid(logits[yes] - logits[no]).item())
    return np.array(scores)


DECODER_FAMILIES = ("qwen2", "mistral", "llama")


def save_decoder(folder: Path, family: str) -> Path:
    """A random decoder embedder in Qwen3's tiny widths, saved as published (last-token pooling):
    Qwen2Model (with its QKV biases), MistralModel or LlamaModel."""
    from transformers import LlamaConfig, LlamaModel, MistralConfig, MistralModel, Qwen2Config, Qwen2Model

    kinds = {
        "qwen2": (Qwen2Config, Qwen2Model),
        "mistral": (MistralConfig, MistralModel),
        "llama": (LlamaConfig, LlamaModel),
    }
    config_class, model_class = kinds[family]
    torch.manual_seed(6)
    extra = {"sliding_window": None} if family == "mistral" else {}
    config = config_class(**QWEN3_SHAPES["tiny"], rope_theta=1_000_000.0, **extra)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)  # Qwen2's QKV biases: not zero, so that a dropped one shows
    folder.mkdir(parents=True, exist_ok=True)
    _finish(folder, model, "last", "", {})
    return folder


SPLADE_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
"""naver/splade-cocondenser-ensembledistil's widths (BERT-base)."""


def save_splade(folder: Path, **sizes: int) -> Path:
    """A random BertForMaskedLM published as sentence-transformers' SparseEncoder saves SPLADE
    models (its Transformer and SpladePooling modules). The LM head's bias is low for most of the
    vocabulary, so that the vectors are sparse as trained ones are."""
    from sentence_transformers import SparseEncoder
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(6)
    tiny = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    config = BertConfig(**{**tiny, **sizes})
    model = BertForMaskedLM(config).eval()
    with torch.no_grad():
        keep = torch.rand(config.vocab_size, generator=torch.Generator().manual_seed(6)) < 0.02
        model.cls.predictions.bias.copy_(torch.where(keep, 0.1, -1.0))
    plain = folder.parent / f"{folder.name}-mlm"
    model.save_pretrained(plain)
    AutoTokenizer.from_pretrained(rose.default_model_path()).save_pretrained(plain)
    SparseEncoder(str(plain)).save(str(folder))
    return folder


def save_bge_m3(folder: Path, **sizes: int) -> Path:
    """A random XLMRobertaModel saved as BGE-M3 is published: sentence-transformers' Transformer,
    CLS Pooling and Normalize, beside FlagEmbedding's `colbert_linear.pt` and `sparse_linear.pt`
    (all-MiniLM-L6-v2's vocabulary behind the encoder, as the XLM-R cross-encoder here has)."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(7)
    tiny = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    config = XLMRobertaConfig(**{**tiny, **sizes}, vocab_size=30522, max_position_embeddings=514, type_vocab_size=1)
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    plain = folder.parent / f"{folder.name}-xlmr"
    model.save_pretrained(plain)
    minilm = rose.default_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (plain / name).write_bytes((minilm / name).read_bytes())
    save_as_sentence_transformer(folder, plain, "cls", 512)
    hidden = config.hidden_size
    colbert, sparse = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        sparse.bias.fill_(0.05)  # about half the tokens get a positive weight, as trained ones do
    torch.save(colbert.state_dict(), folder / "colbert_linear.pt")
    torch.save(sparse.state_dict(), folder / "sparse_linear.pt")
    return folder


COLBERT_SETTINGS = dict(query_prefix="[Q] ", document_prefix="[D] ", query_length=32, document_length=48,
                        attend_to_expansion_tokens=False, do_query_expansion=True)  # fmt: skip
"""A ColBERT model's PyLate settings (its documents shorter than published, for the CPU)."""


def save_colbert(folder: Path, dense: int = 32, **settings: object) -> Path:
    """A random BertModel published as PyLate saves ColBERT models: the tokenizer with the "[Q] "
    and "[D] " tokens added (the embeddings grown to match), modules.json with the Transformer and
    `pylate.models.Dense.Dense` (no bias, Identity), and PyLate's settings (`settings` over
    COLBERT_SETTINGS) in config_sentence_transformers.json."""
    import string

    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(8)
    tokenizer = AutoTokenizer.from_pretrained(rose.default_model_path())
    tokenizer.add_tokens(["[Q] ", "[D] "])
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vocab_size=len(tokenizer))  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    values = {**COLBERT_SETTINGS, **settings}
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": values["document_length"] - 1, "do_lower_case": False})
    )
    (folder / "1_Dense").mkdir(exist_ok=True)
    (folder / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": config.hidden_size, "out_features": dense, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))  # fmt: skip
    linear = torch.nn.Linear(config.hidden_size, dense, bias=False)
    save_file({"linear.weight": linear.weight.detach().contiguous()}, str(folder / "1_Dense" / "model.safetensors"))
    st_config = {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
                 "skiplist_words": list(string.punctuation), **values}  # fmt: skip
    (folder / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2))
    return folder


PYLATE_PINS = ["pylate==1.6.0", "sentence-transformers==5.3.0", "transformers==5.3.0", "tokenizers==0.22.2",
               "huggingface-hub>=1.3,<2", "kernels>=0.10.2,<0.11"]  # fmt: skip
"""PyLate's newest release and the versions it pins, installed apart (tests/.references/pylate)
since they are older than the project's sentence-transformers and transformers."""


def pylate_reference(folder: Path, queries: list[str], documents: list[str]) -> dict[str, list[np.ndarray]]:
    """PyLate's ColBERT in float32 on `folder`, in a process of its own with PyLate's pinned
    versions first on its path (installed there once): each query's and document's vectors and
    the MaxSim of every (query, document)."""
    site = Path(__file__).parent / ".references" / "pylate"
    if not (site / "pylate").is_dir():
        subprocess.run(["python", "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *PYLATE_PINS],
                       check=True)  # fmt: skip
    out = folder.parent / f"{folder.name}-pylate.npz"
    script = Path(__file__).parent / "pylate_reference.py"
    environment = {**os.environ, "PYTHONPATH": str(site)}
    arguments = [str(folder), str(out), json.dumps(queries), json.dumps(documents)]
    subprocess.run(["python", str(script), *arguments], check=True, env=environment)
    saved = np.load(out)
    return {
        "queries": [saved[f"q{i}"] for i in range(len(queries))],
        "documents": [saved[f"d{i}"] for i in range(len(documents))],
        "scores": [saved["scores"][i] for i in range(len(queries))],
    }


def large_step_documents() -> list[list[int]]:
    """64 documents of 32-512 random token ids: one step of ~18k tokens, large enough for the
    kernels of large steps (rose.ops.large_steps)."""
    rng = np.random.default_rng(0)
    return [rng.integers(1000, 30000, size=int(n)).tolist() for n in rng.integers(32, 513, size=64)]


def through_a_loaded_kernel(
    engine: rose.Engine, kernel: LargeStepKernel, docs: list[list[int]], count: Callable[[], None]
) -> None:
    """A kernel for large steps (rose.ops.large_steps.LargeStepKernel) through its life in `engine`
    on `docs`, one large bucket: the bucket's eager run and its capture while the kernel loads
    (held until then), the hand-over (the bucket's graph forgotten, the fidelity check of a large
    step, an eager run), then `count` (which wraps the kernel to count its calls), a capture and a
    replay. Each run's vectors within the bound of the float32 reference."""
    loaded, load = threading.Event(), kernel._load
    kernel._load = lambda: loaded.wait(120) and load()
    unfused = [engine.embed_ids(docs) for _ in range(2)]
    assert kernel.state == "loading"
    loaded.set()
    kernel.wait()
    fused = [engine.embed_ids(docs)]
    assert kernel.state == "ready", kernel.describe()
    assert engine.stats()["cuda_graphs"]["forgotten"] == 1
    assert engine.fidelity["large_batches"]["worst_cosine"] >= 0.999
    count()
    fused += [engine.embed_ids(docs) for _ in range(2)]
    reference = engine.reference(docs)
    for vectors in unfused + fused:
        assert cosines(vectors, reference).min() >= 0.999
    assert cosines(fused[1], fused[2]).min() > 0.99999  # the replay is the capture's run
    assert cosines(fused[0], unfused[0]).min() > 0.999


def through_a_refused_kernel(engine: rose.Engine, kernel: LargeStepKernel, docs: list[list[int]], fake: object) -> None:
    """A kernel for large steps that loads as `fake` and fails the engine's fidelity check when
    handed over: refused, said so, and the steps after it as before it."""
    kernel._load = lambda: fake
    before = engine.embed_ids(docs)  # starts the loading
    kernel.wait()
    after = engine.embed_ids(docs)  # handed over, checked, refused
    state = kernel.describe()
    assert state["state"] == "failed" and "against float32 on large steps" in state["why"], state
    assert engine.fidelity["large_batches"]["worst_cosine"] < 0.999
    assert cosines(after, before).min() > 0.9999
