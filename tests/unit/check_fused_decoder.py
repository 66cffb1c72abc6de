"""Run with TRITON_INTERPRET=1 (tests/unit/test_triton_kernels.py does): rose.decoder.triton's
decoder (the layers in one launch, then the final norm and pooling) against Qwen3's layer-by-layer
path in float32, on the CPU through Triton's interpreter.
The interpreter runs programs one after another, so the kernel is launched as one program that
takes every task of each phase (the tasks are still cut for several), and the grid barrier counts
that one program's arrivals."""

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from rose.attention import create_backend
from rose.batch import RaggedBatch
from rose.decoder.triton import TritonDecoder
from rose.models.pooling import pool
from rose.models.qwen3 import Qwen3

torch.manual_seed(0)
# float16: the interpreter computes bfloat16 dot products wrong (tests/unit/check_triton_kernels.py).
config = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              intermediate_size=192, vocab_size=100, max_position_embeddings=128, rms_norm_eps=1e-6)  # fmt: skip
cpu = torch.device("cpu")


def random_weights(cfg: dict) -> dict[str, torch.Tensor]:
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {"embed_tokens.weight": (cfg["vocab_size"], h), "norm.weight": (h,)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"layers.{n}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.self_attn.q_norm.weight": (d,), f"{p}.self_attn.k_norm.weight": (d,),
            f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h), f"{p}.mlp.down_proj.weight": (h, i),
        }  # fmt: skip
    return {
        name: torch.rand(shape) + 0.5 if "norm" in name else torch.randn(shape) * shape[-1] ** -0.5
        for name, shape in shapes.items()
    }


for causal in (True, False):
    cfg = {**config, "use_bidirectional_attention": not causal}
    weights = random_weights(cfg)
    reference = Qwen3(cfg, weights, torch.float32, cpu)
    model = Qwen3(cfg, weights, torch.float16, cpu)
    decoder = TritonDecoder(model.decoder_weights(), cpu, programs=8, block_k=32)
    # Several column blocks of O and parts of down's inner dimension; gate-up's tile wider than its columns.
    assert decoder.o_cols < cfg["hidden_size"] and decoder.down.split > 1
    assert decoder.gate_up.tile > decoder.gate_up.cols
    decoder.programs = 1
    assert decoder.describe() == {"kernel": "triton", "max_tokens": 16, "programs": 1, "block_k": 32}
    for lengths in ([1], [5, 11], [3, 2, 7]):
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens = int(cu[-1])
        ids = np.random.default_rng(tokens).integers(0, config["vocab_size"], tokens).astype(np.int32)
        batch = RaggedBatch.from_host(ids, cu, cpu)
        attention = create_backend("sdpa", dataclasses.replace(reference.attention_spec, dtype=torch.float32), cpu)
        attention.plan(batch)
        expected = reference.forward(batch, attention)
        for padding in (0, 16 - tokens):  # a graph's bucket: padding tokens after the real ones, counted apart
            padded = RaggedBatch.from_host(np.concatenate([ids, np.zeros(padding, np.int32)]),
                                           np.append(cu, tokens + padding).astype(np.int32), cpu)  # fmt: skip
            padded.token_count = torch.tensor([tokens], dtype=torch.int32)
            for pooling in ("mean", "last"):
                got = decoder(padded, pooling)[: len(lengths)]
                cosine = F.cosine_similarity(got, pool(expected, batch, pooling), dim=1)
                assert cosine.min() > 0.9999, (causal, lengths, padding, pooling, cosine.min())
                assert torch.isfinite(got).all()
        assert not decoder.barrier.any(), decoder.barrier
print("fused decoder matches")
