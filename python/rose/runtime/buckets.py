"""The shapes CUDA graphs are captured for (pure logic): a batch's tokens padded to a bucket,
its sequence count to a power of two, and the warm-up buckets named on the command line."""

from __future__ import annotations


def token_bucket(tokens: int, fine: int = 64, coarse: int = 256, switch: int = 1024) -> int:
    """Tokens padded up to a multiple of `fine` up to `switch`, of `coarse` above."""
    step = fine if tokens <= switch else coarse
    return max(step, -(-tokens // step) * step)


def sequence_slots(sequences: int) -> int:
    """Sequence count padded up to a power of two."""
    return 1 << max(sequences - 1, 0).bit_length()


def bucket(tokens: int, sequences: int, smallest: int | None = None) -> tuple[int, int]:
    """The graph configuration of a batch; one slot is kept for the padding tokens' sequence.
    `smallest`: a bucket of that many tokens below the first (a model's path for single queries)."""
    padded = smallest if smallest is not None and tokens <= smallest else token_bucket(tokens)
    return padded, sequence_slots(sequences + 1)


def parse_warmup(spec: str) -> tuple[int, int]:
    """A warm-up bucket written TOKENSxSEQUENCES (`--warmup 512x8`) as (tokens, sequences)."""
    try:
        tokens, sequences = (int(x) for x in spec.lower().split("x"))
    except ValueError:
        raise ValueError(f"a warm-up bucket is written TOKENSxSEQUENCES, e.g. 512x8; got {spec!r}") from None
    if tokens < 1 or not 1 <= sequences <= tokens:
        raise ValueError(f"a warm-up bucket needs 1 <= sequences <= tokens; got {spec!r}")
    return tokens, sequences


def warmup_lengths(tokens: int, sequences: int) -> list[int]:
    """The sequence lengths of a warm-up batch of that bucket: equal lengths, `tokens` in all at most."""
    return [max(tokens // sequences, 1)] * sequences
