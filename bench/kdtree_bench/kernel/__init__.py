"""Kernel microbenchmarks: the verify kernel against SGLang's kernels, and this GPU's ceilings."""
