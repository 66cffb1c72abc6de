"""The model families ROSE serves: a file each, and a line each in MODELS (config.json's
`model_type` to the class). A family's class is built from (config, weights, dtype, device,
matmul_dtype), names its checkpoint's weight prefixes in `weight_prefixes`, and has
`attention_spec` and `forward(batch, attention, rows=None) -> [tokens, hidden]` (with `rows`, those
rows' states only, the last layer past attention run for them alone); a family that scores names
its `score_pooling` and builds its `score_head(weights, tokenizer, config)` (rose.models.heads; a
head with a `pooling` of its own overrides the family's); a decoder
family may offer `decoder_weights()` for the fused single-query decoders (rose.decoder)."""

from __future__ import annotations

from rose.errors import ModelError
from rose.models.bert import Bert
from rose.models.gemma3 import Gemma3
from rose.models.llama import Llama
from rose.models.modernbert import ModernBert
from rose.models.mpnet import MPNet
from rose.models.qwen2 import Qwen2
from rose.models.qwen3 import Qwen3
from rose.models.xlm_roberta import XlmRoberta

MODELS: dict[str, type] = {
    "bert": Bert,
    "qwen3": Qwen3,
    "qwen2": Qwen2,
    "llama": Llama,
    "mistral": Llama,
    "xlm-roberta": XlmRoberta,
    "roberta": XlmRoberta,
    "mpnet": MPNet,
    "modernbert": ModernBert,
    "gemma3_text": Gemma3,
}


def model_class(model_type: str) -> type:
    """The class that runs `model_type`; says which types are known when it is not."""
    try:
        return MODELS[model_type]
    except KeyError:
        raise ModelError(f"model type {model_type!r} is not supported; supported: {', '.join(MODELS)}") from None
