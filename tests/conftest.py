"""Session-wide test setup shared by every test directory.

SGLang's Triton kernels are the oracle. On a machine without CUDA they run in Triton's
interpreter, which must be switched on before any module decorated with ``triton.jit`` is
imported, hence here, at collection time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
