"""ROSE's own kernels: the Triton ones (norms, RoPE, activation, small-batch attention), and the
dispatch that picks them, FlashInfer's, or the torch reference per tensor."""
