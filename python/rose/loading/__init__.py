"""Getting a model ready to serve: its folder as published, its weights (staged onto the GPU while
torch imports, by prestart), and Triton's cache key."""
