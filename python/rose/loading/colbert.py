"""A late-interaction (ColBERT) model as PyLate publishes it: the encoder, a Dense projection of
every token (`pylate.models.Dense.Dense`), and in config_sentence_transformers.json the query and
document prefixes, their lengths, query expansion and the document skiplist. Read without torch."""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

# PyLate's defaults for settings a folder leaves out (pylate.models.ColBERT).
_DEFAULTS: dict[str, Any] = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
}


def is_colbert(modules: list[dict[str, Any]], st_config: dict[str, Any]) -> bool:
    """Whether a folder is a PyLate ColBERT model: a PyLate module, or its settings."""
    pylate_module = any(m.get("type", "").startswith("pylate.") for m in modules)
    return pylate_module or st_config.get("similarity_fn_name") == "MaxSim" or "query_length" in st_config


@dataclass
class ColbertSettings:
    """How a ColBERT model takes its inputs (PyLate's `ColBERT.tokenize` and `encode`): a prefix
    token after the first one, queries padded with the tokenizer's mask token to `query_length`
    (query expansion), documents cut at `document_length` and their skiplist tokens left out of
    the vectors."""

    query_prefix: str
    document_prefix: str
    query_length: int
    document_length: int
    do_query_expansion: bool
    attend_to_expansion_tokens: bool
    skiplist_words: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, st_config: dict[str, Any]) -> ColbertSettings:
        values = {key: st_config.get(key, default) for key, default in _DEFAULTS.items()}
        # Attending to expansion tokens needs them (PyLate turns it off without expansion).
        values["attend_to_expansion_tokens"] = values["attend_to_expansion_tokens"] and values["do_query_expansion"]
        skiplist = st_config.get("skiplist_words")
        return cls(**values, skiplist_words=list(string.punctuation) if skiplist is None else list(skiplist))

    def template(self, tokenizer: Any, names: dict[str, Any]) -> dict[str, Any]:
        """The token ids Ivy needs (Ivy's template's `multi_vector`): `tokenizer` a `tokenizers`
        Tokenizer, `names` the folder's special token names (tokenizer_config.json)."""

        def token_id(token: str | None) -> int | None:
            return None if not token else tokenizer.token_to_id(token)

        def special(key: str) -> int | None:
            token = names.get(key)
            return token_id(token.get("content") if isinstance(token, dict) else token)

        # PyLate pads queries with the mask token, else the end-of-sequence one.
        expansion = special("mask_token")
        expansion = special("eos_token") if expansion is None else expansion
        # convert_tokens_to_ids gives the unknown token's id for a word outside the vocabulary.
        unknown = special("unk_token")
        skiplist = {token_id(word) for word in self.skiplist_words}
        skiplist = {unknown if i is None else i for i in skiplist} - {None}
        return {
            "query_prefix_id": token_id(self.query_prefix),
            "document_prefix_id": token_id(self.document_prefix),
            "query_length": self.query_length,
            "document_length": self.document_length,
            "expansion_id": expansion if self.do_query_expansion else None,
            "skiplist_ids": sorted(skiplist),
        }
