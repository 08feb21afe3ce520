"""CUDA implementation of the verify op: filled in by the kernel (issue 3)."""
