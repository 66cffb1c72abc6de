"""Score heads: what a score model computes from a sequence's pooled state, in float32, after the
forward pass (the fidelity check compares the pooled states the heads read)."""

from __future__ import annotations

import torch


class TanhClassifier:
    """BERT's pooler and classifier, and RoBERTa's classification head, alike:
    logits = out(tanh(dense(state)))."""

    def __init__(
        self, dense: torch.Tensor, dense_bias: torch.Tensor, out: torch.Tensor, out_bias: torch.Tensor
    ) -> None:
        self.dense, self.dense_bias = dense.float().contiguous(), dense_bias.float()
        self.out, self.out_bias = out.float().contiguous(), out_bias.float()

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(torch.nn.functional.linear(pooled, self.dense, self.dense_bias))
        return torch.nn.functional.linear(hidden, self.out, self.out_bias)


class RowScore:
    """One logit from one row: a causal reranker's yes-minus-no logit at the last token, the
    difference of the LM head's two rows made at load (never the full vocabulary projection)."""

    def __init__(self, row: torch.Tensor) -> None:
        self.row = row.float().reshape(-1, 1).contiguous()

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled @ self.row
