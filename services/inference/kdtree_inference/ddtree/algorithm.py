"""``--speculative-algorithm DDTREE``: registered with SGLang 0.5.23 by the kdtree plugin.

SGLang lets a plugin register a speculative algorithm (``SpeculativeAlgorithm.register``). DDTree
is DFlash's draft with a tree verify, so ``DDTreeAlgorithm`` answers ``is_dflash()``: SGLang then
sets up everything DFlash needs (the draft's KV pool, the target's aux hidden-state capture, the
decode graphs' ``DFlashVerifyInput``) and ``create_worker`` returns ``DDTreeWorker``. What differs
from DFlash:

- ``--speculative-num-draft-tokens`` is the verify width ``W = budget + 1`` (the tree's nodes and
  its root): the target's verify graphs and the KV reserved per step follow it. By default it is
  the draft's block size (budget = block - 1). ``kdtree-serve`` also takes
  ``--speculative-ddtree-budget N``, the same as ``--speculative-num-draft-tokens N+1``;
- the draft runs its own block, the draft's ``dflash_config`` block size capped at ``W`` (a tree
  of ``budget`` nodes is at most ``budget`` deep), and its graphs are captured at that width;
- the verify graphs carry the tree mask: DFlash captures kdtree's backend without one.

What it cannot serve is refused at startup, naming the flag to change.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

logger = logging.getLogger("kdtree.ddtree")

NAME = "DDTREE"


class DDTreeConfigError(ValueError):
    """A server configuration DDTree cannot serve."""


@functools.lru_cache(maxsize=8)
def _draft_config_block_size(draft_path: str, trust_remote_code: bool) -> int | None:
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.utils.hf_transformers_utils import get_config

    config = get_config(draft_path, trust_remote_code=trust_remote_code)
    if getattr(config, "dflash_config", None) is None:
        raise DDTreeConfigError(
            f"DDTREE needs a DFlash draft: {draft_path} has no dflash_config in its config.json "
            "(--speculative-draft-model-path)"
        )
    return parse_dflash_draft_config(draft_hf_config=config).resolve_block_size(default=None)


def draft_block_size(draft_path: str, width: int, trust_remote_code: bool = False) -> int:
    """The draft's block: its ``dflash_config`` block size, at most the verify width ``width``."""
    block = _draft_config_block_size(str(draft_path), bool(trust_remote_code))
    return min(int(block or width), int(width))


def served_draft_block_size() -> int:
    """``draft_block_size`` of the server this process runs, from SGLang's resolved config."""
    from sglang.srt.runtime_context import get_model, get_spec

    spec = get_spec()
    return draft_block_size(
        spec.speculative_draft_model_path,
        spec.speculative_num_draft_tokens,
        get_model().trust_remote_code,
    )


def check_server_args(server_args: Any) -> None:
    """Refuse, with the flag to change, what this worker cannot serve."""
    from .options import TOPK_ENV, ddtree_topk
    from .tree import max_tree_nodes

    def refuse(message: str) -> None:
        raise DDTreeConfigError(f"--speculative-algorithm DDTREE: {message}")

    if server_args.speculative_draft_model_path is None:
        refuse("set --speculative-draft-model-path to a DFlash draft")
    if not server_args.disable_overlap_schedule:
        refuse("it runs without overlap scheduling; add --disable-overlap-schedule")
    if int(server_args.tp_size or 1) != 1:
        refuse("its tree is built from one rank's view of the draft head; run with --tp-size 1")
    if int(server_args.pp_size or 1) != 1:
        refuse("pipeline parallelism is not supported; run with --pp-size 1")
    if getattr(server_args, "enable_dp_attention", False):
        refuse("dp attention is not supported; drop --enable-dp-attention")
    if int(server_args.page_size or 1) != 1:
        refuse("it moves accepted KV token by token; run with --page-size 1")
    if str(server_args.grammar_backend or "xgrammar") != "none":
        refuse(
            "its tree verify takes no grammar constraints; add --grammar-backend none (structured "
            "output requests then fail instead of being served unconstrained)"
        )
    if server_args.speculative_draft_window_size is not None:
        refuse("the draft window is not supported; drop --speculative-draft-window-size")
    if server_args.speculative_dflash_block_size is not None:
        refuse(
            "the draft block comes from the draft's dflash_config; set the tree's size with "
            "--speculative-num-draft-tokens (budget + 1) and drop --speculative-dflash-block-size"
        )
    width = server_args.speculative_num_draft_tokens
    if width is not None and int(width) < 2:
        refuse(
            f"--speculative-num-draft-tokens {width} leaves no tree: it is budget + 1, at least 2"
        )
    if width is not None:
        budget, top_k = int(width) - 1, ddtree_topk(os.environ)
        depth = draft_block_size(
            server_args.speculative_draft_model_path, int(width), server_args.trust_remote_code
        )
        depth -= 1
        if budget > max_tree_nodes(depth, top_k):
            refuse(
                f"a budget of {budget} nodes does not fit a tree {depth} deep with {top_k} "
                f"candidates per depth; raise {TOPK_ENV} or lower --speculative-num-draft-tokens"
            )


def _keep_declarations(resolver: Any, server_args: Any) -> None:
    """Run one of SGLang's own DFlash resolvers on the plugin's stand-in of the server args.

    SGLang hands a registered algorithm a recorder that declares the fields it writes; SGLang's
    resolvers declare instead, which on the recorder lands in a list nobody reads. Their
    declarations are written back as the plugin's own.
    """
    before = len(getattr(server_args, "_resolved_overrides", None) or ())
    resolver(server_args)
    for _source, fields in list(getattr(server_args, "_resolved_overrides", None) or ())[before:]:
        for name, value in fields.items():
            setattr(server_args, name, value)


def _spec_class() -> type:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DDTreeAlgorithm(CustomSpecAlgo):
        """DFlash's plumbing, DDTree's worker and widths."""

        # SGLang's scheduler calls these on its algorithm whatever it is (``init_disaggregation``:
        # ``carries_draft_hidden_states``, ``init_overlap``: ``create_future_map``, whose map
        # calls ``need_topk``), and ``CustomSpecAlgo`` has none of them: the scheduler would
        # stop at start with an AttributeError. SGLang's own definitions, which read only the
        # ``is_*()`` answers below (no draft hidden states carried, no top-k relayed, a plain
        # FutureMap).
        carries_draft_hidden_states = SpeculativeAlgorithm.carries_draft_hidden_states
        need_topk = SpeculativeAlgorithm.need_topk
        create_future_map = SpeculativeAlgorithm.create_future_map

        def is_dflash(self) -> bool:
            return True

        def is_dflash_family(self) -> bool:
            return True

        def supports_target_verify_for_draft(self) -> bool:
            return True

        def supports_prefill_shared_read_done(self) -> bool:
            return True

        def handle_server_args(self, server_args: Any) -> None:
            from sglang.srt.arg_groups.speculative_hook import _handle_dflash

            if server_args.speculative_dflash_block_size is not None:
                check_server_args(server_args)  # refuses it before DFlash's check reads it
            _keep_declarations(_handle_dflash, server_args)
            check_server_args(server_args)

        def get_num_tokens_per_req_for_target_verify(
            self, num_draft_tokens: int, is_draft_worker: bool
        ) -> int:
            if not is_draft_worker:
                return num_draft_tokens
            return served_draft_block_size()

    return DDTreeAlgorithm


def _needs_tree_mask() -> bool:
    try:
        from sglang.srt.runtime_context import get_spec

        algorithm = get_spec().speculative_algorithm
    except (ImportError, ValueError, AttributeError):
        return False
    return str(algorithm or "").upper() == NAME


def _register_tree_mask_policy() -> None:
    """Captured DDTree verifies carry the tree mask (DFlash's own verify stays causal)."""
    from sglang.srt.speculative import dflash_utils

    current = dflash_utils.resolve_dflash_verify_mask_policy
    if getattr(current, "kdtree_policy", False):
        return

    @functools.wraps(current)
    def resolve_verify_mask_policy(attn_backend: Any) -> tuple[str, bool]:
        name, build_custom_mask = current(attn_backend)
        return name, build_custom_mask or _needs_tree_mask()

    resolve_verify_mask_policy.kdtree_policy = True
    dflash_utils.resolve_dflash_verify_mask_policy = resolve_verify_mask_policy


def register() -> None:
    """Register ``DDTREE`` with SGLang (idempotent: the plugin runs once per process)."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_registry import get_spec
    except ImportError:
        logger.warning("kdtree: this SGLang has no speculative-algorithm registry; no DDTREE")
        return
    _register_tree_mask_policy()
    if get_spec(NAME) is not None:
        return

    def create_worker(server_args: Any) -> type:
        from .worker import DDTreeWorker

        return DDTreeWorker

    SpeculativeAlgorithm.register(NAME, supports_overlap=False, spec_class=_spec_class())(
        create_worker
    )
    logger.info("kdtree: speculative algorithm %s registered", NAME)
