"""The ``sglang.srt.plugins`` entry point: install ``KdtreeTritonAttnBackend`` as "triton".

SGLang calls ``load_plugins()`` in the launching process and again in every scheduler process it
spawns (``run_scheduler_process``), so registering here reaches the processes that build the
attention backend; a patch made only in the launcher would not (spawn starts fresh
interpreters). Replacing the "triton" entry of ``ATTENTION_BACKENDS`` rather than adding a new
name keeps every name-based check in SGLang (``--attention-backend triton``, server-args
validation, the hybrid and draft backends' choices) working unchanged.

EAGLE's draft-extend backend is not looked up in that registry: SGLang's ``DraftBackendFactory``
builds ``TritonAttnBackend`` by class for "triton". Its factory method is replaced too, so the
draft extend gets our subclass (which serves it only when KDTREE_VERIFY and KDTREE_DRAFT_EXTEND
say so, and is the parent otherwise).

DFlash's decode CUDA-graph runner decides by the attention backend's class *name* whether a
captured target verify gets a custom-mask buffer (``dflash_utils.resolve_dflash_verify_mask_policy``:
names in ``_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS`` verify with the causal block, every other
backend gets a buffer that DFlash's replays never fill). Our subclass computes what
``TritonAttnBackend`` computes, so its name joins that set; otherwise every mode, ``off``
included, would verify DFlash's block against an unfilled mask under graphs.

The entry point is declared in services/inference/pyproject.toml:
    [project.entry-points."sglang.srt.plugins"]
    kdtree_verify = "kdtree_inference.sglang.plugin:register"
"""

from __future__ import annotations

import logging
import os
from typing import Any

from . import start_gate

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


def _create_kdtree_draft_extend_backend(factory: Any) -> tuple[str, Any]:
    """``DraftBackendFactory._create_triton_prefill_backend``, building our subclass."""
    from .backend import KdtreeTritonAttnBackend

    return "triton", KdtreeTritonAttnBackend(factory.draft_model_runner, skip_prefill=False)


_create_kdtree_draft_extend_backend.kdtree_factory = True


def _register_draft_extend() -> None:
    try:
        from sglang.srt.speculative.draft_utils import DraftBackendFactory
    except ImportError:  # a build of SGLang without speculative decoding
        logger.warning("kdtree: SGLang has no DraftBackendFactory; draft extend stays stock")
        return
    current = getattr(DraftBackendFactory, "_create_triton_prefill_backend", None)
    if getattr(current, "kdtree_factory", False):
        return
    if current is None:
        logger.warning("kdtree: DraftBackendFactory has no triton draft-extend factory to replace")
        return
    DraftBackendFactory._create_triton_prefill_backend = _create_kdtree_draft_extend_backend
    logger.info("kdtree: EAGLE draft-extend backend 'triton' -> KdtreeTritonAttnBackend")


BACKEND_CLASS_NAME = "KdtreeTritonAttnBackend"


def _register_dflash_causal_verify() -> None:
    try:
        from sglang.srt.speculative import dflash_utils
    except ImportError:  # a build of SGLang without DFlash
        return
    names = getattr(dflash_utils, "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS", None)
    if names is None:
        logger.warning("kdtree: SGLang's DFlash has no causal-verify backend list to join")
        return
    if BACKEND_CLASS_NAME not in names:
        dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS = frozenset(
            {*names, BACKEND_CLASS_NAME}
        )


def register() -> None:
    """Replace the "triton" attention backend factories with ours (idempotent), and register
    ``--speculative-algorithm DDTREE``; then, in a scheduler's start with ``KDTREE_START_GATE``
    set, wait for that gate (``start_gate``)."""
    _register_backends()
    start_gate.hold_scheduler(os.environ)


def _register_backends() -> None:
    _register_draft_extend()
    _register_dflash_causal_verify()
    from ..ddtree import algorithm as ddtree

    ddtree.register()
    from sglang.srt.layers.attention import attention_registry

    current = attention_registry.ATTENTION_BACKENDS.get(BACKEND_NAME)
    if getattr(current, "kdtree_factory", False):
        return
    if current is None:
        logger.warning("kdtree: SGLang has no %r attention backend to replace", BACKEND_NAME)
    attention_registry.ATTENTION_BACKENDS[BACKEND_NAME] = create_kdtree_triton_backend
    logger.info("kdtree: attention backend %r -> KdtreeTritonAttnBackend", BACKEND_NAME)
