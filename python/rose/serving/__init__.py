"""The serving loop: the engine (step() and the LazyTensor hand-off), its start-up checks, the
fidelity check, and the timeline of the GPU's steps."""
