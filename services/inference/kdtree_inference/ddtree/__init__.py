"""DDTree: a DFlash draft turned into a tree under a node budget, verified in one target forward.

``tree`` is the algorithm (plain numpy and torch, tested on the CPU); ``algorithm`` registers
``--speculative-algorithm DDTREE`` with SGLang; ``worker`` is the SGLang worker that runs it.
"""
