"""Re-indexing a corpus with one command (`ivy-embed`, tulip.reindex.cli) or from Python:
`reindex` runs the loop, `read` loads a finished output in corpus order."""

from tulip.reindex.corpus import Corpus, shard_range
from tulip.reindex.output import Layout, Vectors, read
from tulip.reindex.run import reindex

__all__ = ["Corpus", "Layout", "Vectors", "read", "reindex", "shard_range"]
