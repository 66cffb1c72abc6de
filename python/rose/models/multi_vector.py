"""BGE-M3's heads beside its dense CLS vector, as FlagEmbedding publishes them in the model folder
(`colbert_linear.pt`, `sparse_linear.pt`): a ColBERT projection and a lexical weight for every
token, computed in the same pass as the hidden states."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from rose.batch import RaggedBatch
from rose.errors import ModelError

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

    @property
    def multi_vector_dimensions(self) -> int:
        return int(self.colbert[0].shape[0])

    def __call__(self, hidden: torch.Tensor, batch: RaggedBatch) -> torch.Tensor:
        """[tokens, hidden] -> [tokens, hidden + colbert + 1] float32."""
        hidden = hidden.float()
        weights = torch.relu(F.linear(hidden, *self.sparse))
        weights = weights * ~torch.isin(batch.input_ids, self.special)[:, None]
        return torch.cat([hidden, F.linear(hidden, *self.colbert), weights], dim=1)
