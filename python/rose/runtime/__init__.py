"""What runs the model on a device: CUDA graphs and their buckets, device input buffers, the CUDA
driver and NVRTC through ctypes, and the on-disk cache. Nothing here imports torch at import
time except graphs and inputs (rose.loading.prestart uses the rest before torch is imported)."""
