"""The engine: batches concurrent requests and runs tree speculative decoding over the verify op.

One worker thread owns the model and the KV pool. Each loop iteration it
1. admits waiting requests (while the pool can hold their worst case) and prefills each one
   (an extend with an empty prefix and a causal mask: the same attention call as verify);
2. runs ONE verify forward for all running requests: every request contributes a draft tree of
   exactly ``num_draft_tokens`` nodes rooted at its last committed token (SGLang's fixed draft
   count, so ``qo_indptr`` = arange x N), with the tree as SGLang's flat ``custom_mask``;
3. commits per request the longest path whose every token equals the target's greedy choice at its
   parent, plus one bonus token from the last accepted node, keeps those nodes' KV slots and frees
   the rest.
Greedy output is therefore exactly plain greedy decoding (``num_draft_tokens=1`` *is* plain
decoding). Requests with temperature > 0 accept no drafts: they sample the root's successor only,
which keeps sampling exact without rejection sampling.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from .attention import ExtendMetadata
from .config import EngineConfig
from .drafter import DraftTree, NgramIndex, NgramTreeDrafter
from .fault_injection import attention_backend, faulty_weights
from .kv_pool import MLAKVPool
from .model import TinyMLAModel, load_weights_with_digest, seeded_digest, seeded_weights
from .sampling import sample_token, token_logprobs
from .tokenizer import ByteTokenizer

log = logging.getLogger("kdtree_inference.engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineStepError(RuntimeError):
    """A forward failed inside the engine (a server fault, not a client error)."""


class RequestAborted(RuntimeError):
    """The request was aborted (its client went away) before it finished."""


@dataclass
class GenerationRequest:
    """One prompt's generation job, already validated by the API layer."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    ignore_eos: bool = False
    stop_strs: list[str] = field(default_factory=list)
    stop_token_ids: set[int] = field(default_factory=set)
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    sampling_seed: int | None = None
    # Called on the worker thread with the partial result after every step (streaming).
    on_progress: Callable[[GenerationResult], None] | None = None
    # Set by Engine.abort from any thread; the worker drops the request at its next step.
    aborted: bool = False


@dataclass
class GenerationResult:
    rid: str
    prompt_tokens: int
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict | None = None
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    spec_num_proposed_drafts: int = 0
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    e2e_latency: float = 0.0
    first_token_latency: float = 0.0  # seconds from prefill start to the first output token


@dataclass
class _Running:
    req: GenerationRequest
    result: GenerationResult
    future: Future
    start: float
    slots: torch.Tensor  # committed KV slots, in sequence order
    index: NgramIndex  # every token whose KV is committed (drafter context)
    root: int  # last emitted token: committed in output, its KV not yet in the pool
    generator: torch.Generator | None

    @property
    def seq_len(self) -> int:
        return self.slots.shape[0]


class Engine:
    """Thread-safe front: ``submit`` from any thread, results through futures."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.tokenizer = ByteTokenizer()
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self._queue: queue.Queue[tuple[GenerationRequest, Future] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.step_listeners: list[Callable[[str, int, int, int], None]] = []
        self.model: TinyMLAModel | None = None
        self.pool: MLAKVPool | None = None
        self.drafter = NgramTreeDrafter(config.spec, config.model.vocab_size)
        self.num_running = 0
        self.num_waiting = 0
        self.num_aborted = 0  # requests dropped by abort() before they finished
        # What the weights are, known once loaded: for /model_info and the parity gate's resume.
        self.weights_identity: dict[str, str | None] = {}

    # ---- lifecycle -------------------------------------------------------------------------
    def load(self) -> None:
        """Build backend, model and pool, then warm up with a short generation."""
        cfg = self.config
        if cfg.warmup_delay_s > 0:
            # Lets tests and demos observe the not-ready state (/health 503) deterministically.
            time.sleep(cfg.warmup_delay_s)
        backend = attention_backend(
            cfg.attention,
            cfg.device,
            cfg.injected_fault,
            cfg.attention_kv_splits,
            tolerance=(cfg.validate_atol, cfg.validate_rtol),
        )
        if cfg.weights_dir:
            weights, self.weights_identity = load_weights_with_digest(cfg.model, cfg.weights_dir)
        else:
            weights = seeded_weights(cfg.model)
            self.weights_identity = {"path": None, "sha256": seeded_digest(cfg.model)}
        weights = faulty_weights(weights, cfg.injected_fault)
        dtype = DTYPES[cfg.dtype]
        self.model = TinyMLAModel(
            cfg.model, backend, weights, cfg.device, dtype, cfg.fault_layer, cfg.fault_scale
        )
        self.pool = MLAKVPool(
            cfg.kv_pool_size, cfg.model.num_layers, dtype, cfg.device, seed=cfg.model.seed
        )

    def start(self) -> None:
        """Load and warm up on the worker thread; ``ready`` is set once it can serve."""
        self._thread = threading.Thread(target=self._run, name="kdtree-engine", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until warm; raise if loading failed or took longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.failed is not None:
                raise RuntimeError(f"engine failed to start: {self.failed}") from self.failed
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine not ready after {timeout}s")

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, req: GenerationRequest) -> Future:
        future: Future = Future()
        self._queue.put((req, future))
        return future

    def abort(self, req: GenerationRequest) -> None:
        """Stop ``req`` (from any thread): its KV slots are freed and its future fails with
        RequestAborted at the worker's next step; a request that already finished is left be."""
        req.aborted = True
        self._queue.put(None)  # wakes an idle worker

    def generate(self, req: GenerationRequest, timeout: float | None = None) -> GenerationResult:
        return self.submit(req).result(timeout=timeout)

    def generate_greedy(
        self,
        texts: list[str],
        max_new_tokens: int,
        *,
        top_logprobs_num: int = 0,
        timeout: float | None = None,
    ) -> list[GenerationResult]:
        """Greedy continuations of ``texts`` (exactly ``max_new_tokens`` each), in order.

        All are submitted before any is awaited, so they share verify forwards (ragged batches).
        ``top_logprobs_num`` > 0 also returns that many top logprobs per generated position.
        """
        futures = [
            self.submit(
                GenerationRequest(
                    rid=str(i),
                    input_ids=self.tokenizer.encode(text),
                    max_new_tokens=max_new_tokens,
                    ignore_eos=True,
                    temperature=0.0,
                    return_logprob=top_logprobs_num > 0,
                    top_logprobs_num=top_logprobs_num,
                )
            )
            for i, text in enumerate(texts)
        ]
        return [f.result(timeout=timeout) for f in futures]

    def max_request_tokens(self) -> int:
        """Most KV slots one request may need: prompt + output + one draft tree."""
        return self.config.kv_pool_size - 1

    # ---- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.load()
            warm = GenerationRequest(rid="warmup", input_ids=[256, 104, 105], max_new_tokens=4)
            self._serve_batch([(warm, Future())], [])
            self.ready.set()
            log.info(
                "engine ready (attention=%s device=%s)", self.config.attention, self.config.device
            )
        except BaseException as exc:  # reported through /health and the CLI exit code
            log.exception("engine failed to start")
            self.failed = exc
            return
        running: list[_Running] = []
        waiting: list[tuple[GenerationRequest, Future]] = []
        while not self._stop.is_set():
            block = not running and not waiting
            try:
                item = self._queue.get(block=block, timeout=0.5 if block else None)
                while item is not None:
                    waiting.append(item)
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            if self._stop.is_set():
                break
            waiting, running = self._drop_aborted(waiting, running)
            try:
                running = self._serve_batch(waiting, running, one_step=True)
            except Exception as exc:  # never lose a request silently: fail them all
                log.exception("engine step failed")
                failure = EngineStepError(f"engine step failed: {type(exc).__name__}: {exc}")
                for item in running:
                    self._release(item)
                    if not item.future.done():
                        item.future.set_exception(failure)
                running = []
            self.num_running, self.num_waiting = len(running), len(waiting)
        for req, future in waiting:
            future.set_exception(RuntimeError(f"engine stopped before serving {req.rid}"))
        for item in running:
            item.future.set_exception(RuntimeError(f"engine stopped while serving {item.req.rid}"))

    def _drop_aborted(
        self, waiting: list[tuple[GenerationRequest, Future]], running: list[_Running]
    ) -> tuple[list[tuple[GenerationRequest, Future]], list[_Running]]:
        """Remove aborted requests: free their slots, fail their futures, count them."""
        still_waiting = []
        for req, future in waiting:
            if req.aborted:
                self.num_aborted += 1
                if not future.done():
                    future.set_exception(RequestAborted(f"request {req.rid} was aborted"))
            else:
                still_waiting.append((req, future))
        still_running = []
        for item in running:
            if item.req.aborted:
                self.num_aborted += 1
                self._release(item)
                if not item.future.done():
                    item.future.set_exception(
                        RequestAborted(
                            f"request {item.req.rid} was aborted after "
                            f"{len(item.result.output_ids)} tokens"
                        )
                    )
            else:
                still_running.append(item)
        return still_waiting, still_running

    def _serve_batch(
        self,
        waiting: list[tuple[GenerationRequest, Future]],
        running: list[_Running],
        one_step: bool = False,
    ) -> list[_Running]:
        """Admit from ``waiting`` (mutated), then decode; with one_step, a single verify step."""
        while True:
            self._admit(waiting, running)
            if running:
                running = self._decode_step(running)
            if one_step or (not running and not waiting):
                return running

    def _reserve(self, req: GenerationRequest) -> int:
        return len(req.input_ids) + req.max_new_tokens + self.config.spec.num_draft_tokens

    def _admit(
        self, waiting: list[tuple[GenerationRequest, Future]], running: list[_Running]
    ) -> None:
        assert self.pool is not None
        reserved = sum(self._reserve(r.req) - r.seq_len for r in running)
        while waiting and len(running) < self.config.max_batch_size:
            req, future = waiting[0]
            if self._reserve(req) > self.pool.num_free - reserved:
                if not running:
                    waiting.pop(0)
                    future.set_exception(
                        ValueError(
                            f"request {req.rid} needs {self._reserve(req)} KV slots, the pool has "
                            f"{self.pool.num_free}"
                        )
                    )
                    continue
                break  # wait for running requests to finish and free their slots
            waiting.pop(0)
            if future.set_running_or_notify_cancel():
                try:
                    item = self._prefill(req, future)
                except Exception as exc:  # this request fails; the others carry on
                    log.exception("prefill of %s failed", req.rid)
                    future.set_exception(
                        EngineStepError(f"prefill failed: {type(exc).__name__}: {exc}")
                    )
                    continue
                if item.result.finish_reason is None:
                    running.append(item)
                    reserved += self._reserve(req) - item.seq_len
                else:
                    self._finish(item)

    def _prefill(self, req: GenerationRequest, future: Future) -> _Running:
        assert self.model is not None and self.pool is not None
        start = time.perf_counter()
        n = len(req.input_ids)
        slots = self.pool.alloc(n)
        try:
            logits = self._chunked_prefill(req.input_ids, slots)
        except Exception:
            self.pool.free(slots)
            raise
        result = GenerationResult(rid=req.rid, prompt_tokens=n)
        if req.return_logprob and req.logprob_start_len >= 0:
            self._input_logprobs(req, logits, result)
        generator = None
        if req.temperature > 0:
            generator = torch.Generator()
            generator.manual_seed(
                req.sampling_seed if req.sampling_seed is not None else self.config.model.seed
            )
        index = NgramIndex(self.config.spec.ngram_min, self.config.spec.ngram_max)
        index.extend(req.input_ids)
        item = _Running(req, result, future, start, slots, index, root=-1, generator=generator)
        if req.max_new_tokens == 0:
            result.finish_reason = {"type": "length", "length": 0}
            return item
        token = sample_token(
            logits[-1], req.temperature, req.top_k, req.top_p, req.min_p, generator
        )
        self._emit(item, [(token, logits[-1])])
        item.root = token
        return item

    def _chunked_prefill(self, input_ids: list[int], slots: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] of the prompt, computed ``prefill_chunk`` tokens per forward.

        Each chunk is an SGLang extend: its prefix is the chunks before it (``kv_indices``), the
        chunk itself is a causal block (``custom_mask=None``). Chunking keeps every verify-op call
        within the draft-token counts the kernel is built for, and is what SGLang's chunked
        prefill does.
        """
        assert self.model is not None and self.pool is not None
        device = self.pool.device
        chunk = self.config.prefill_chunk
        ids = torch.tensor(input_ids, dtype=torch.int64, device=device)
        logits = []
        for lo in range(0, len(input_ids), chunk):
            hi = min(lo + chunk, len(input_ids))
            meta = ExtendMetadata(
                qo_indptr=torch.tensor([0, hi - lo], dtype=torch.int32, device=device),
                kv_indptr=torch.tensor([0, lo], dtype=torch.int32, device=device),
                kv_indices=slots[:lo],
                custom_mask=None,
                mask_indptr=None,
                out_cache_loc=slots[lo:hi],
                max_extend_len=hi - lo,
            )
            positions = torch.arange(lo, hi, device=device)
            logits.append(self.model.forward(ids[lo:hi], positions, meta, self.pool).cpu())
        return torch.cat(logits)

    def _input_logprobs(
        self, req: GenerationRequest, logits: torch.Tensor, result: GenerationResult
    ) -> None:
        # SGLang: position p's logprob is p(input[p] | input[:p]); the very first token has None.
        for pos in range(req.logprob_start_len, len(req.input_ids)):
            token = req.input_ids[pos]
            if pos == 0:
                result.input_token_logprobs.append((None, token))
                result.input_top_logprobs.append(None)
                continue
            lp, top = token_logprobs(logits[pos - 1], token, req.top_logprobs_num)
            result.input_token_logprobs.append((lp, token))
            result.input_top_logprobs.append(top)

    def _decode_step(self, running: list[_Running]) -> list[_Running]:
        assert self.model is not None and self.pool is not None
        spec = self.config.spec
        n = spec.num_draft_tokens
        device = self.pool.device
        trees: list[DraftTree] = []
        masks, ids, positions, out_locs = [], [], [], []
        for item in running:
            tree = self.drafter.propose(item.index, item.root)
            trees.append(tree)
            prefix = item.seq_len
            block = torch.ones(n, prefix + n, dtype=torch.bool)
            block[:, prefix:] = tree.visibility()
            masks.append(block.flatten())
            ids.extend(tree.tokens)
            positions.extend(prefix + d for d in tree.depths)
            out_locs.append(self.pool.alloc(n))
        prefix_lens = torch.tensor([item.seq_len for item in running], dtype=torch.int64)
        batch = len(running)
        kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(prefix_lens, 0)
        mask_indptr = torch.zeros(batch + 1, dtype=torch.int64)
        mask_indptr[1:] = torch.cumsum(n * (prefix_lens + n), 0)
        out_cache_loc = torch.cat(out_locs)
        meta = ExtendMetadata(
            qo_indptr=(torch.arange(batch + 1, dtype=torch.int32) * n).to(device),
            kv_indptr=kv_indptr.to(device),
            kv_indices=torch.cat([item.slots for item in running]),
            custom_mask=torch.cat(masks).to(device),
            mask_indptr=mask_indptr.to(device),
            out_cache_loc=out_cache_loc,
            max_extend_len=n,
        )
        try:
            logits = self.model.forward(
                torch.tensor(ids, dtype=torch.int64, device=device),
                torch.tensor(positions, dtype=torch.int64, device=device),
                meta,
                self.pool,
            ).cpu()
        except Exception:
            self.pool.free(out_cache_loc)  # the caller fails these requests and frees the rest
            raise
        if self.config.decode_step_delay_s > 0:  # the test/benchmark slow-candidate knob
            time.sleep(self.config.decode_step_delay_s)
        still_running = []
        for b, (item, tree) in enumerate(zip(running, trees, strict=True)):
            self._commit(item, tree, logits[b * n : (b + 1) * n], out_locs[b])
            if item.result.finish_reason is None:
                still_running.append(item)
            else:
                self._finish(item)
        return still_running

    def _commit(
        self, item: _Running, tree: DraftTree, logits: torch.Tensor, tree_slots: torch.Tensor
    ) -> None:
        """Accept the longest greedy-consistent path, keep its KV, emit its tokens + a bonus."""
        req = item.req
        children = tree.children()
        path = [0]
        emitted: list[tuple[int, torch.Tensor]] = []
        node = 0
        while True:
            choice = sample_token(
                logits[node], req.temperature, req.top_k, req.top_p, req.min_p, item.generator
            )
            emitted.append((choice, logits[node]))
            if req.temperature > 0:
                break  # sampled requests accept no drafts (see module docstring)
            match = next((c for c in children[node] if tree.tokens[c] == choice), None)
            if match is None:
                break
            path.append(match)
            node = match
        keep = torch.tensor(path, dtype=torch.int64, device=tree_slots.device)
        drop = torch.ones(tree.size, dtype=torch.bool, device=tree_slots.device)
        drop[keep] = False
        self.pool.free(tree_slots[drop])
        item.slots = torch.cat([item.slots, tree_slots[keep]])
        item.index.extend([tree.tokens[i] for i in path])
        result = item.result
        result.spec_verify_ct += 1
        result.spec_num_proposed_drafts += tree.size - 1
        result.spec_num_correct_drafts += len(path) - 1
        self._emit(item, emitted)
        item.root = result.output_ids[-1]
        for listener in self.step_listeners if self.ready.is_set() else ():  # not warmup
            listener(self.config.attention, tree.size - 1, len(path) - 1, len(emitted))

    def _emit(self, item: _Running, tokens: list[tuple[int, torch.Tensor]]) -> None:
        """Append tokens to the output one by one, stopping at the first finish condition."""
        req, result = item.req, item.result
        for token, logits in tokens:
            result.output_ids.append(token)
            if len(result.output_ids) == 1:
                result.first_token_latency = time.perf_counter() - item.start
            if req.return_logprob:
                lp, top = token_logprobs(logits, token, req.top_logprobs_num)
                result.output_token_logprobs.append((lp, token))
                result.output_top_logprobs.append(top)
            result.finish_reason = self._finish_reason(req, result)
            if result.finish_reason is not None:
                break
        if req.on_progress is not None:
            result.text = self._output_text(req, result)
            req.on_progress(result)

    def _finish_reason(self, req: GenerationRequest, result: GenerationResult) -> dict | None:
        token = result.output_ids[-1]
        if not req.ignore_eos and token == self.tokenizer.eos_token_id:
            return {"type": "stop", "matched": token}
        if token in req.stop_token_ids:
            return {"type": "stop", "matched": token}
        if req.stop_strs:
            tail = self.tokenizer.decode(result.output_ids)
            for stop in req.stop_strs:
                if stop and stop in tail:
                    return {"type": "stop", "matched": stop}
        if len(result.output_ids) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        return None

    def _output_text(self, req: GenerationRequest, result: GenerationResult) -> str:
        text = self.tokenizer.decode(result.output_ids, skip_special_tokens=req.skip_special_tokens)
        reason = result.finish_reason
        if reason and isinstance(reason.get("matched"), str) and not req.no_stop_trim:
            text = text[: text.find(reason["matched"])]
        return text

    def _release(self, item: _Running) -> None:
        assert self.pool is not None
        self.pool.free(item.slots)
        item.slots = item.slots[:0]

    def _finish(self, item: _Running) -> None:
        self._release(item)
        item.result.text = self._output_text(item.req, item.result)
        item.result.e2e_latency = time.perf_counter() - item.start
        if not item.future.done():
            item.future.set_result(item.result)
