"""Heads that give every token a vector of its own beside its hidden state, computed in the same
pass: BGE-M3's, as FlagEmbedding publishes them in the model folder (`colbert_linear.pt`,
`sparse_linear.pt`: a ColBERT projection and a lexical weight a token), and a PyLate ColBERT
model's Dense projection."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from rose.batch import RaggedBatch
from rose.errors import ModelError
from rose.models.dense import DenseModules

if TYPE_CHECKING:
    from rose.loading.model_dir import ModelDir

COLBERT_FILE, SPARSE_FILE = "colbert_linear.pt", "sparse_linear.pt"


def has_m3_heads(folder: Path) -> bool:
    """Whether the folder publishes BGE-M3's two heads (FlagEmbedding loads them only as a pair)."""
    return (folder / COLBERT_FILE).is_file() and (folder / SPARSE_FILE).is_file()


class M3Heads:
    """Token rows [hidden | colbert_linear(hidden) | relu(sparse_linear(hidden))] in float32; the
    lexical weight of a special token (FlagEmbedding's cls, eos, pad and unk) is 0."""

    def __init__(self, folder: Path, special_ids: list[int], device: torch.device) -> None:
        def load(name: str) -> dict[str, torch.Tensor]:
            state = torch.load(folder / name, map_location=device, weights_only=True)
            if "weight" not in state:
                raise ModelError(f"{folder / name} holds no Linear weight")
            return {k: v.float() for k, v in state.items()}

        colbert, sparse = load(COLBERT_FILE), load(SPARSE_FILE)
        self.colbert = (colbert["weight"], colbert.get("bias"))
        self.sparse = (sparse["weight"], sparse.get("bias"))
        self.special = torch.tensor(sorted(set(special_ids)), dtype=torch.int32, device=device)

    lexical_weights = True

    @property
    def multi_vector_dimensions(self) -> int:
        return int(self.colbert[0].shape[0])

    def __call__(self, hidden: torch.Tensor, batch: RaggedBatch) -> torch.Tensor:
        """[tokens, hidden] -> [tokens, hidden + colbert + 1] float32."""
        hidden = hidden.float()
        weights = torch.relu(F.linear(hidden, *self.sparse))
        weights = weights * ~torch.isin(batch.input_ids, self.special)[:, None]
        return torch.cat([hidden, F.linear(hidden, *self.colbert), weights], dim=1)


class ColbertHead:
    """Token rows [hidden | Dense(hidden)] in float32: a PyLate model's projection of every token
    (Tulip normalizes the multi-vectors, as PyLate's encode does)."""

    lexical_weights = False

    def __init__(self, dense: DenseModules) -> None:
        self.dense = dense

    @property
    def multi_vector_dimensions(self) -> int:
        return self.dense.out_features

    def __call__(self, hidden: torch.Tensor, batch: RaggedBatch) -> torch.Tensor:
        hidden = hidden.float()
        return torch.cat([hidden, self.dense(hidden)], dim=1)


def token_head(model_dir: ModelDir, dense: DenseModules | None, device: torch.device) -> M3Heads | ColbertHead | None:
    """The folder's per-token head: BGE-M3's, a ColBERT model's Dense projection, or None."""
    if model_dir.colbert is not None:
        if dense is None:
            raise ModelError(f"{model_dir.path} is a ColBERT model without its Dense projection")
        return ColbertHead(dense)
    if has_m3_heads(model_dir.path):
        return M3Heads(model_dir.path, model_dir.special_token_ids(), device)
    return None


def expansion_key_lengths(ids: np.ndarray, cu: np.ndarray, expansion_id: int) -> list[int] | None:
    """Each sequence's tokens before its trailing run of `expansion_id` (a ColBERT query's
    expansion), or None when no sequence ends in one. A query's own tokens end with a special
    token that is not the expansion one, so only the padding is cut; a sequence of expansion ids
    alone keeps them all (it would have no key otherwise)."""
    lengths = np.diff(cu)
    if not len(lengths) or not np.any(ids[cu[1:][lengths > 0] - 1] == expansion_id):
        return None
    kept = np.flatnonzero(ids != expansion_id)
    # The last kept token of each sequence: the last index of `kept` below the sequence's end.
    last = np.searchsorted(kept, cu[1:], side="left") - 1
    ends = np.where(last >= 0, kept[np.maximum(last, 0)] + 1, 0)
    keys = ends - cu[:-1]
    return np.where(keys > 0, keys, lengths).astype(int).tolist()
