"""Random-weight model folders for tests, saved as published (config.json, safetensors,
sentence-transformers pooling), with all-MiniLM-L6-v2's tokenizer, and their Hugging Face
transformers references in float32."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

import rose

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
    # Its widths in two layers: the sizes rose.cuda_decoder takes, quick to write.
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
