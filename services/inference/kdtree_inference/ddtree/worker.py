"""``DDTreeWorker``: SGLang 0.5.23's DFlash worker with a draft *tree* verified in one forward.

Prefill is DFlash's (the target's prompt hidden states go into the draft's KV cache). Each decode
step then:

1. runs DFlash's draft over a block of ``B`` positions (the bonus token and ``B - 1`` mask
   tokens), ``B`` = the draft's block size capped at the verify width;
2. takes each depth's top-k log-probabilities from the target's head over the draft's hidden
   states and builds the best-first tree of ``budget`` nodes (``tree.best_first_nodes``, the
   batched form of ``tree.build_tree``) on the device, replayed as a CUDA graph per batch size
   (``step_graphs``): nothing waits for the draft, so the host queues the verify while the GPU
   still runs the draft's attention;
3. verifies the ``W = budget + 1`` tree nodes in one ``TARGET_VERIFY`` forward with the
   ancestor-only mask in SGLang's tree layout, so the attention backend sees an EAGLE-style
   tree (kdtree's kernel in ``on``, SGLang's Triton tree verify in ``off``);
4. walks the tree along the target's greedy tokens (``tree.accept_greedy``, a graph too),
   moves the accepted nodes' target KV to consecutive slots, writes their hidden states to the
   draft's KV cache, and commits the path plus the bonus token.

Greedy only: a sampled request is verified greedily (logged once), as SGLang's DFlash does where
its sampling verify is unavailable. The scheduler runs this worker without overlap.

Only the algorithm's ``create_worker`` imports this module, inside SGLang's scheduler: SGLang's
DFlash worker module loads its kernels at import time, which no other process should pay for.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_utils import (
    apply_dflash_verify_logits_adjustments,
    is_dense_head_weight,
)
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
)
from sglang.srt.speculative.draft_worker_common import (
    build_block_pos_offsets,
    make_draft_block_spec_info,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import draft_tp_context

from .algorithm import served_draft_block_size
from .options import ddtree_search, ddtree_topk
from .step_graphs import TreeStepGraphs, tree_search
from .tree import head_top_k, layout_from_nodes

logger = logging.getLogger("kdtree.ddtree")


class DDTreeWorker(DFlashWorkerV2):
    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.verify_width = int(get_spec().speculative_num_draft_tokens)
        self.budget = self.verify_width - 1
        self.top_k = ddtree_topk(os.environ)
        if self.selector is not None or self.lilicorr is not None or self._is_domino:
            raise ValueError(
                "DDTREE needs a plain DFlash draft (no candidate selector, LiLiCorr or "
                "Domino head): it builds its tree from the draft's per-position logits"
            )
        if mambaish_config(self.model_runner.model_config) is not None:
            # DFlash rolls a hybrid target's recurrent state along its verified chain; a
            # tree's nodes share no one chain, so that state would be left wrong.
            raise ValueError("DDTREE verifies a tree: targets with mamba layers are not served")
        head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        if not is_dense_head_weight(getattr(head, "weight", None)):
            raise ValueError(
                "DDTREE scores the draft's candidates with the target's lm_head as a dense "
                "matrix; this target's head has no dense weight"
            )
        # DFlash sized its block from --speculative-num-draft-tokens, which for DDTree is the
        # verify width; the draft runs its own block, at most that wide.
        self.block_size = served_draft_block_size()
        self.draft_model.set_block_size(self.block_size)
        self._block_pos_offsets = build_block_pos_offsets(
            length=self.block_size, device=self.device
        )
        self._draft_block_spec_info = make_draft_block_spec_info(
            draft_token_num=self.block_size, device=self.device
        )
        self.speculative_num_draft_tokens = self.verify_width
        self._warned_sampling = False
        self.search = ddtree_search(os.environ)
        self._tree_graphs = TreeStepGraphs(self.budget, tree_search(self.search))
        logger.info(
            "kdtree DDTree worker: budget %d (verify width %d), draft block %d, top-%d, "
            "%s tree search",
            self.budget,
            self.verify_width,
            self.block_size,
            self.top_k,
            self.search,
        )

    def _maybe_build_draft_sampler(self):
        # The tree needs the draft's hidden states, not a folded greedy head.
        return None

    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ):
        if (
            batch.forward_mode.is_extend()
            or batch.is_extend_in_batch
            or batch.forward_mode.is_idle()
        ):
            return super().forward_batch_generation(
                batch, on_publish, grammar_barrier, pp_proxy_tensors
            )
        return self._decode_tree(batch, on_publish)

    # ---- one decode step
    def _window_slots(self, batch, prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
        bs = len(prefix_lens)
        return assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + width,
            batch_size=bs,
            draft_token_num=width,
            device=self.device,
        ).view(bs, width)

    def _plan(self, batch, draft_input, prefix_lens, slots: torch.Tensor):
        return self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=(
                batch.seq_lens_cpu
                if batch.seq_lens_cpu is not None
                else draft_input.nxt_kv_lens_cpu
            ),
            write_virtual=slots.reshape(-1),
            read_extent=int(slots.shape[1]),
        )

    def _draft_top_k(self, batch, draft_input, prefix_lens, window, prefix_cpu):
        """Run the draft block; return each depth's top-k (log-probs, token ids), each
        ``[bs, B - 1, k]`` on the device."""
        bs, block = len(prefix_lens), self.block_size
        target_model = self.target_worker.model_runner.model
        embed_module = unwrap_lora_layer(
            _resolve_dflash_embedding_module(self.draft_model, target_model)
        )
        block_ids = torch.full(
            (bs, block), int(self._mask_token_id), dtype=torch.long, device=self.device
        )
        block_ids[:, 0].copy_(draft_input.bonus_tokens.view(-1))
        positions = (prefix_lens.view(-1, 1).to(torch.int64) + self._block_pos_offsets).view(-1)
        slots = window[:, :block].contiguous()
        if self._full_embed_gpu is not None:
            embeds = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            embeds = embed_module(block_ids)
        if self._noise_embed_scale != 1.0:
            embeds = embeds * self._noise_embed_scale
        plan = self._plan(batch, draft_input, prefix_lens, slots)
        seq_lens_cpu = (prefix_cpu + block).to(torch.int32)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=slots.reshape(-1),
            seq_lens_sum=int(seq_lens_cpu.sum()),
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=embeds.view(-1, embeds.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=self.device)
                if enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        # As DFlash runs its draft: under the draft's own parallel layout.
        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            draft_out = self.draft_model_runner.forward(forward_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFlash draft returned no hidden states")
        hidden = hidden[: bs * block].view(bs, block, -1)[:, 1:, :]
        values, indices = head_top_k(
            hidden.reshape(-1, hidden.shape[-1]),
            unwrap_lora_layer(target_model.lm_head).weight,
            vocab=int(self.model_runner.model_config.vocab_size),
            top_k=self.top_k,
        )
        depth = block - 1
        return values.view(bs, depth, -1), indices.view(bs, depth, -1)

    def _decode_tree(self, batch, on_publish):
        """One decode step: the draft's tree, its verify, the accepted path committed. What
        it reads of ``batch`` is taken here, before the verify prepares the batch anew."""
        draft_input, sampling_info = batch.spec_info, batch.sampling_info
        self._warn_sampling_once(sampling_info)
        width = self.verify_width
        prefix_lens = batch.seq_lens
        # The mask's row stride is prefix_len + W, read by the backend from the device's
        # seq_lens: take the exact lengths from there. The step's one sync, at its start,
        # when the GPU has finished the step before.
        prefix_cpu = prefix_lens.to("cpu", torch.int64)
        window = self._window_slots(batch, prefix_lens, width)

        top_logprobs, top_tokens = self._draft_top_k(
            batch, draft_input, prefix_lens, window, prefix_cpu
        )
        nodes = self._tree_graphs.search(
            draft_input.bonus_tokens.view(-1), top_tokens, top_logprobs
        )
        layout = layout_from_nodes(nodes, prefix_lens, prefix_cpu)
        plan = self._plan(batch, draft_input, prefix_lens, window)
        target_out = self._verify(batch, sampling_info, layout, plan, window, prefix_cpu)
        return self._commit(batch, target_out, plan, prefix_lens, window, on_publish)

    def _warn_sampling_once(self, sampling_info) -> None:
        if (
            sampling_info is not None
            and not sampling_info.is_all_greedy
            and not self._warned_sampling
        ):
            logger.warning(
                "DDTREE verifies greedily; requests with temperature > 0 are served their "
                "greedy tokens"
            )
            self._warned_sampling = True

    def _verify(self, batch, sampling_info, layout, plan, window, prefix_cpu):
        """The tree's nodes in one target forward with its mask; the target's output, its
        logits adjusted as DFlash's verify adjusts them."""
        width = self.verify_width
        verify_input = DFlashVerifyInput(
            # A copy: the tree's buffers are the graph's, rewritten by the next step.
            draft_token=layout.tokens.reshape(-1).clone(),
            positions=layout.positions,
            draft_token_num=width,
            custom_mask=layout.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=plan,
        )
        batch.out_cache_loc = window.reshape(-1)
        saved_cpu, saved_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        host_bound = prefix_cpu + width
        batch.seq_lens_cpu = host_bound
        batch.seq_lens_sum = int(host_bound.sum())
        verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = saved_cpu, saved_sum
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        target_lp = self._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = target_lp.finish_deferred_gather(
                logits_output.next_token_logits
            )
        if sampling_info is not None:
            apply_dflash_verify_logits_adjustments(
                next_token_logits=logits_output.next_token_logits,
                sampling_info=sampling_info,
                draft_token_num=width,
            )
        return target_out

    def _commit(self, batch, target_out, plan, prefix_lens, window, on_publish):
        """Walk the tree along the target's greedy tokens, keep the accepted path's KV in
        the target's and the draft's caches, and hand SGLang the step's result."""
        bs, width = len(prefix_lens), self.verify_width
        logits_output = target_out.logits_output
        predict = torch.argmax(logits_output.next_token_logits, dim=-1).view(bs, width)
        accepted = self._tree_graphs.accept(predict, window)
        acceptance, rows = accepted.acceptance, accepted.rows

        if batch.return_logprob:
            # The path's logits in chain order, as the logprob pass reads a DFlash block.
            # Only then: nothing past this step reads the logits, and the gather copies
            # bs x W full-vocab rows.
            logits_output.next_token_logits = logits_output.next_token_logits[rows]
            compute_spec_logprobs(
                batch,
                logits_output,
                acceptance.out_tokens.reshape(-1),
                chain_stride=width,
            )

        pool = self.model_runner.token_to_kv_pool_allocator.get_kvcache()
        pool.move_kv_cache(accepted.kv_targets, accepted.kv_sources)
        new_seq_lens = prefix_lens + acceptance.commit_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)

        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states, but got None")
        hidden = hidden[: bs * width][rows]
        cache_loc = self._draft_write_ids(plan)
        chain_positions = (
            prefix_lens.view(-1, 1).to(torch.int64)
            + torch.arange(width, device=self.device)[None, :]
        ).view(-1)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden,
            cache_loc=cache_loc,
            cache_loc_2d=cache_loc.view(bs, width),
            positions=chain_positions,
            commit_lens=acceptance.commit_lens,
        )
        logits_output.hidden_states = None

        next_draft_input = self._make_next_draft_input_decode(
            bonus_tokens=acceptance.bonus, new_seq_lens=new_seq_lens
        )
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=acceptance.out_tokens.reshape(-1),
            accept_lens=acceptance.commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=width,
            new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )
