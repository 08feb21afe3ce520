"""The ``sglang.srt.plugins`` entry point: install ``KdtreeTritonAttnBackend`` as "triton".

SGLang calls ``load_plugins()`` in the launching process and again in every scheduler process it
spawns (``run_scheduler_process``), so registering here reaches the processes that build the
attention backend; a patch made only in the launcher would not (spawn starts fresh
interpreters). Replacing the "triton" entry of ``ATTENTION_BACKENDS`` rather than adding a new
name keeps every name-based check in SGLang (``--attention-backend triton``, server-args
validation, the hybrid and draft backends' choices) working unchanged.

The entry point is declared in services/inference/pyproject.toml:
    [project.entry-points."sglang.srt.plugins"]
    kdtree_verify = "kdtree_inference.sglang.plugin:register"
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("kdtree.verify")

BACKEND_NAME = "triton"


def create_kdtree_triton_backend(runner: Any) -> Any:
    """The registry factory: SGLang's own "triton" checks, then our subclass."""
    # The same guard as sglang's create_triton_backend (attention_registry.py).
    assert not runner.model_config.is_encoder_decoder, (
        "Cross attention is not supported in the triton attention backend. "
        "Please use `--attention-backend flashinfer`."
    )
    from .backend import KdtreeTritonAttnBackend

    return KdtreeTritonAttnBackend(runner)


create_kdtree_triton_backend.kdtree_factory = True  # marks our entry, for idempotence


def register() -> None:
    """Replace the "triton" attention backend factory with ours (idempotent)."""
    from sglang.srt.layers.attention import attention_registry

    current = attention_registry.ATTENTION_BACKENDS.get(BACKEND_NAME)
    if getattr(current, "kdtree_factory", False):
        return
    if current is None:
        logger.warning("kdtree: SGLang has no %r attention backend to replace", BACKEND_NAME)
    attention_registry.ATTENTION_BACKENDS[BACKEND_NAME] = create_kdtree_triton_backend
    logger.info("kdtree: attention backend %r -> KdtreeTritonAttnBackend", BACKEND_NAME)
