"""CPU attention: sequences of similar length padded into groups for torch's SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rose.attention.base import AttentionBackend, AttentionSpec
from rose.batch import RaggedBatch


def length_groups(lengths: list[int], max_waste: float = 0.25, min_tokens: int = 64) -> list[list[int]]:
    """Splits sequence indices into groups of similar length, so that padding each group to its
    longest member wastes at most `max_waste` of its tokens (groups under `min_tokens` padded
    tokens may waste more: there padding costs less than another call)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    real = 0
    for i in order:
        if groups:
            group = groups[-1]
            padded = lengths[group[0]] * (len(group) + 1)
            if padded <= min_tokens or padded <= (1 + max_waste) * (real + lengths[i]):
                group.append(i)
                real += lengths[i]
                continue
        groups.append([i])
        real = lengths[i]
    return groups


# Every SDPA kernel but cuDNN's: on Hopper torch prefers cuDNN for masked attention, and it builds
# a plan for each new (sequences, length) shape, which the length groups make many of.
_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class _Group:
    gather: torch.Tensor  # [B * L] token index for each padded slot
    keep: torch.Tensor  # [B * L] bool, slots that hold real tokens
    mask: torch.Tensor | None  # [B, 1, L or 1, L] bool (or float with a bias), None when no slot is padding
    sequences: int
    length: int
    window_mask: torch.Tensor | None = None  # the mask within the spec's sliding window


class SdpaBackend(AttentionBackend):
    """torch.nn.functional.scaled_dot_product_attention on padded groups: ROSE's CPU backend, and
    on a GPU the float32 reference of the fidelity check (too slow to serve there)."""

    name = "sdpa"
    takes_relative_bias = True
    takes_window = True  # as a dense band mask per length group: SDPA takes no window
    graph_safe = False  # its groups follow each batch's lengths
    shares_keys = True

    def __init__(self, spec: AttentionSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.key_lengths: list[int] | None = None
        """Set before `plan`: each sequence's keys are its first so many tokens (every token of
        it still queries), for ColBERT queries whose expansion tokens no token attends to."""
        self._groups: list[_Group] = []
        self._scatter: torch.Tensor = torch.empty(0, dtype=torch.long)
        self._keys: list[tuple[slice, torch.Tensor, torch.Tensor]] | None = None

    def plan_keys(self, batch: RaggedBatch, key_cu_seqlens: np.ndarray, key_rows: torch.Tensor) -> None:
        # One call a sequence: its queries, its keys' rows, and the causal mask aligned to the
        # end of its keys.
        cu, key_cu = batch.cu_seqlens_host.tolist(), key_cu_seqlens.tolist()
        self._keys = []
        for i in range(batch.num_sequences):
            queries, keys = cu[i + 1] - cu[i], key_cu[i + 1] - key_cu[i]
            mask = torch.ones(queries, keys, dtype=torch.bool, device=self.device).tril(keys - queries)
            self._keys.append((slice(cu[i], cu[i + 1]), key_rows[key_cu[i] : key_cu[i + 1]], mask))

    def plan(self, batch: RaggedBatch) -> None:
        self._keys = None
        starts = batch.cu_seqlens_host[:-1].tolist()
        lengths = batch.lengths
        self._groups = []
        order = []
        for members in length_groups(lengths):
            length = lengths[members[0]]
            slot = torch.arange(length, device=self.device)
            lens = torch.tensor([lengths[i] for i in members], device=self.device)
            first = torch.tensor([starts[i] for i in members], device=self.device)
            keep = slot[None, :] < lens[:, None]  # [B, L]
            keys = keep
            if self.key_lengths is not None:
                keys = slot[None, :] < torch.tensor([self.key_lengths[i] for i in members], device=self.device)[:, None]
            # Padded slots read their sequence's first token; the mask hides them.
            gather = first[:, None] + torch.where(keep, slot[None, :], 0)
            mask = None
            if not bool(keys.all()):
                mask = keys[:, None, None, :]
                if self.spec.causal:
                    mask = mask & torch.ones(length, length, dtype=torch.bool, device=self.device).tril()[None, None]
            window_mask = None
            if self.spec.window is not None and length > self.spec.window + 1:
                offset = slot[None, :] - slot[:, None]  # key minus query
                band = offset.abs() <= self.spec.window
                if self.spec.causal:
                    band &= offset <= 0
                window_mask = band[None, None] if mask is None else mask & band[None, None]
            if self.spec.relative_bias is not None:
                mask = self._biased(length, mask)
            group = _Group(gather.flatten(), keep.flatten(), mask, len(members), length, window_mask)
            self._groups.append(group)
            order.append(gather[keep])
        # Where each group's real output rows go in the packed output.
        self._scatter = torch.cat(order) if order else torch.empty(0, dtype=torch.long, device=self.device)

    def _biased(self, length: int, mask: torch.Tensor | None) -> torch.Tensor:
        """The relative bias of `length` tokens as a float mask [1 or B, heads, L, L], with -inf
        where `mask` hides a slot."""
        table = self.spec.relative_bias
        longest = (table.shape[1] + 1) // 2
        slot = torch.arange(length, device=self.device)
        bias = table[:, slot[None, :] - slot[:, None] + longest - 1][None].to(self.spec.dtype)
        if mask is None:
            return bias
        return bias.masked_fill(~mask, float("-inf"))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windowed: bool = False) -> torch.Tensor:
        if self._keys is not None:
            return self._attend_keys(q, k, v)
        with sdpa_kernel(_KERNELS):
            outputs = self._attend(q, k, v, windowed)
        result = torch.empty_like(q)
        result[self._scatter] = torch.cat(outputs)
        return result

    def _attend_keys(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        result = torch.empty_like(q)
        gqa = self.spec.num_kv_heads != self.spec.num_heads
        with sdpa_kernel(_KERNELS):
            for queries, rows, mask in self._keys or []:
                qs, ks, vs = (t.transpose(0, 1)[None] for t in (q[queries], k[rows], v[rows]))
                out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.spec.scale, enable_gqa=gqa)
                result[queries] = out[0].transpose(0, 1)
        return result

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windowed: bool) -> list[torch.Tensor]:
        spec = self.spec
        outputs = []
        for g in self._groups:
            qg, kg, vg = (t[g.gather].view(g.sequences, g.length, -1, spec.head_dim).transpose(1, 2) for t in (q, k, v))
            mask = g.window_mask if windowed and g.window_mask is not None else g.mask
            out = F.scaled_dot_product_attention(
                qg,
                kg,
                vg,
                attn_mask=mask,
                is_causal=spec.causal and mask is None,
                scale=spec.scale,
                enable_gqa=spec.num_kv_heads != spec.num_heads,
            )
            outputs.append(out.transpose(1, 2).reshape(g.sequences * g.length, -1, spec.head_dim)[g.keep])
        return outputs
