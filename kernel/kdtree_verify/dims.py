"""The MLA head dimensions the verify op is built for (DeepSeek's absorbed attention).

The one source of these widths for the kernel package and its callers; csrc/verify_config.h
states the same numbers for the compiled kernel (kHeadDimQK, kHeadDimV).
"""

V_DIM = 512
"""The latent (compressed KV) width: the value head and the first columns of every key row."""
ROPE_DIM = 64
"""The decoupled rope part of every query and key row."""
QK_DIM = V_DIM + ROPE_DIM
"""The query/key head width, 576: latent then rope."""
