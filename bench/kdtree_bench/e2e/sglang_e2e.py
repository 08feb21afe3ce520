#!/usr/bin/env python3
"""End-to-end runs of real SGLang 0.5.23 servers with the kdtree backend: decode speed, off vs on.

Each configuration is one ``kdtree-serve`` server (``bench/kdtree_bench/e2e/sglang_servers.py``) serving a model
from ``bench/kdtree_bench/models/make_model.py`` with EAGLE's draft tree and decode CUDA graphs. The
correctness checks (validate identical to off, the parity gate between real servers) are the GPU
test module ``tests/gpu/test_sglang_e2e.py``; this script measures speed and writes the records
that ``bench/results/sglang_e2e_h200.json`` collects.

How a measurement is taken, per (batch, prompt length), a "shape": ``batch`` distinct prompts of
``prompt_len`` random token ids go in one /generate call with ``max_new_tokens`` 1, which
prefills them into the radix cache, then one untimed warm-up generation of ``--warmup-tokens``
(first-use compilation, eager paths and CUDA-graph replays of this batch size happen there), on
every server, before any timing. Then ``--repeats`` timed calls with ``max_new_tokens`` N and
``ignore_eos`` per server. Their prompts hit the cache (one token is recomputed), so each time is
N tokens of decode for the whole batch at once, and SGLang's own ``spec_verify_ct`` says how many
speculative steps that took:

- ``tokens_per_s`` = generated tokens of the batch / wall time of the call;
- ``step_ms`` = wall time / the largest ``spec_verify_ct`` of the batch;
- ``accept_length`` = generated tokens / verify steps, averaged over the batch.

A record holds the median of the repetitions with their min and max (``tokens_per_s_min`` ...),
every repetition (``samples``), and whether the repetitions generated the same tokens. Servers
are measured one at a time (never two decoding at once), in an order that alternates per shape
and per repetition (off,on then on,off), so neither mode always runs first after a warm-up.
``--spec`` and ``--kv-dtype`` pick the configuration family (EAGLE, DFlash or DDTree, bf16 or
FP8 KV cache) that one command measures; every record names it (``spec``, ``kv_dtype``,
``model``). Several algorithms (``--spec ddtree,dflash``) or DDTree budgets (``--budget 8,64``)
give every mode a server per algorithm and budget, all started together and measured in one
alternating order, so they compare on one card in one command; the servers must then fit the
GPU together (SGLang gives each ``--mem-fraction`` of what is free when it starts, so the
n-th server gets about (1 - f)^(n-1) f of the card: docs/development.md's memory plan).
``--kv-tokens auto`` caps every server's KV pool at what the largest shape needs (SGLang's
``--max-total-tokens``), so a server takes no more of the card than the run uses and leaves the
rest to the servers that start after it.
``speed.json`` is written again after every shape (``complete`` false until the last one), so a
run cut by a time limit keeps what it measured; a shape cut by SIGINT keeps its repetitions done
so far, each such record with ``error`` "cut after k of n timed repetitions". ``bench/kdtree_bench/analysis/merge_e2e.py`` folds the ``speed.json``
files of runs into the committed record.

``--profile-shape BxP`` profiles one measured shape with SGLang's own profiler after its timed
repetitions: one more generation of ``--profile-tokens`` per server between /start_profile and
/stop_profile (``bench/kdtree_bench/profiling/sglang_profile.py``); the traces go to ``OUT/profile/<configuration>/``,
GPU time per verify step per kernel, side by side, to ``OUT/profile/profile.md`` and
``speed.json``'s ``profile``.

Usage (on the GPU machine, with the payload's environment; see docs/development.md):
    python -m kdtree_bench.e2e.sglang_e2e --model DIR --out OUT [--batches 1,8] [--prompt-lens 1024,...]
                               [--shapes 1x1024,1x131072,8x32768,...]
        [--repeats 3] [--spec eagle|dflash|ddtree[,...] --draft DIR [--draft-window N]
                                   [--budget N[,N...]] [--draft-attention-backend BACKEND]]
        [--kv-dtype bf16|fp8]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdtree_bench.e2e.gpu_memory import servers_mib
from kdtree_bench.e2e.sglang_servers import (
    DDTREE,
    DDTREE_BUDGET,
    DFLASH,
    DFLASH_BLOCK_SIZE,
    DRAFT_ATTENTION_BACKENDS,
    GRAPH_MAX_BS,
    POOLS_WAIT_S,
    ServerSpec,
    SGLangServer,
    kv_pool_cap,
    kv_tokens_needed,
    sigint_interrupts,
    start_all,
    stop_all,
)
from kdtree_bench.models.model_names import made_model_name
from kdtree_bench.profiling.host_samples import HostSampler
from kdtree_bench.profiling.sglang_profile import (
    comparison,
    comparison_markdown,
    merged_times,
    profile_decode,
)

MODES = {
    # configuration: (KDTREE_VERIFY, more environment)
    "off": ("off", {}),
    "on": ("on", {}),
    # on for target verify only: what serving EAGLE's draft extend through the kernel buys.
    "on_draft_triton": ("on", {"KDTREE_DRAFT_EXTEND": "off"}),
    # on with the kernel's exact fp8 mode (an fp8 KV cache): what SGLang's roundings cost.
    "on_fp16": ("on", {"KDTREE_FP8_NUMERICS": "fp16"}),
    # on with DDTree's tree searched by torch's sorts instead of the Triton heap kernel.
    "on_torch_search": ("on", {"KDTREE_DDTREE_SEARCH": "torch"}),
}
DEFAULT_MODES = ("off", "on", "on_draft_triton")
"""--modes when not given; on_fp16 and on_torch_search only where asked for (they need an fp8 KV
cache or DDTree to differ)."""
SPECS = ("eagle", "dflash", "ddtree")
"""The speculative algorithms a speed run can serve (``--spec``)."""
DRAFT_MODEL_SPECS = ("dflash", "ddtree")
"""Those that serve a draft model (``--draft``)."""
RECORD_PREFIX = "[e2e] "
"""What starts the line each record is printed on as it is measured (then the record's JSON)."""
KV_DTYPE_NAMES = {"bf16": "bfloat16", "fp8": "fp8_e4m3"}
"""--kv-dtype -> the dtype a ServerSpec (and a record's ``kv_dtype``) names."""
SUMMARIZED = ("tokens_per_s", "step_ms", "accept_length", "wall_s", "verify_steps_max")
"""Per-repetition values a record reports as median (the plain name), ``_min`` and ``_max``."""
SAMPLE_FIELDS = (*SUMMARIZED, "started_at", "host_busy_cpus")
"""What a record keeps of each repetition: those values, its start (Unix time) and how many of
the host's CPUs were busy on average during it (``/proc/stat``; None where unreadable): a
host-bound step slows down when other work takes the host."""


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``BxP,...`` (batch x prompt tokens) -> [(prompt_len, batch), ...] in the order given."""
    shapes = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        try:
            batch, prompt_len = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected BxP items like 1x131072, got {item!r}"
            ) from None
        if batch < 1 or prompt_len < 1:
            raise argparse.ArgumentTypeError(f"expected positive sizes, got {item!r}")
        shapes.append((prompt_len, batch))
    if not shapes:
        raise argparse.ArgumentTypeError("expected at least one BxP shape")
    return shapes


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from error
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_specs(text: str) -> list[str]:
    """``ddtree,dflash`` -> ["ddtree", "dflash"]: known algorithms, each once, in order."""
    specs = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(specs) - set(SPECS))
    if not specs or unknown:
        raise argparse.ArgumentTypeError(
            f"expected algorithms from {', '.join(SPECS)}, got {text!r}"
        )
    if len(set(specs)) != len(specs):
        raise argparse.ArgumentTypeError(f"an algorithm is named twice in {text!r}")
    return specs


def random_prompts(
    batch: int, length: int, vocab: int, seed: int, avoid: frozenset[int] = frozenset()
) -> list[list[int]]:
    """``batch`` distinct prompts of ``length`` token ids (no special tokens: ids 2 and up, none
    of ``avoid``, e.g. a DFlash draft's mask token)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(batch):
        prompt: list[int] = []
        while len(prompt) < length:
            token = rng.randrange(2, vocab)
            if token not in avoid:
                prompt.append(token)
        prompts.append(prompt)
    return prompts


def mode_order(names: list[str], shape: int, repeat: int) -> list[str]:
    """The order the servers are measured in, for repetition ``repeat`` of shape ``shape``:
    as given, then reversed, alternating, so no configuration always comes first (or last)."""
    return list(names) if (shape + repeat) % 2 == 0 else list(reversed(names))


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the repetitions, for each of ``SUMMARIZED`` (None if no
    repetition had a value, e.g. no verify steps)."""
    out: dict[str, Any] = {"repeats": len(samples)}
    for key in SUMMARIZED:
        values = [s[key] for s in samples if s.get(key) is not None]
        median = statistics.median(values) if values else None
        out[key] = round(median, 4) if median is not None else None
        out[f"{key}_min"] = min(values) if values else None
        out[f"{key}_max"] = max(values) if values else None
    return out


def metric_values(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> {sample name: [(labels, value), ...]}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return values


def metric_sum(values: dict, name: str, **labels: str) -> float:
    """Sum of a sample over the label sets that match ``labels``."""
    return sum(
        v for got, v in values.get(name, []) if all(got.get(k) == w for k, w in labels.items())
    )


GREEDY = {"temperature": 0, "ignore_eos": True}


def generate(
    server: SGLangServer, prompts: list[list[int]], new_tokens: int, timeout_s: float
) -> tuple[list[dict[str, Any]], float]:
    """One /generate call for the whole batch; its answers and its wall time in seconds."""
    t0 = time.perf_counter()
    answers = server.post(
        "/generate",
        {"input_ids": prompts, "sampling_params": {**GREEDY, "max_new_tokens": new_tokens}},
        timeout_s,
    )
    wall_s = time.perf_counter() - t0
    return (answers if isinstance(answers, list) else [answers]), wall_s


def warm_up(
    server: SGLangServer, prompts: list[list[int]], warmup_tokens: int, timeout_s: float
) -> dict[str, float]:
    """Prefill ``prompts`` into the radix cache, then one untimed generation of this shape."""
    _, prefill_s = generate(server, prompts, 1, timeout_s)
    _, warmup_s = generate(server, prompts, warmup_tokens, timeout_s)
    return {"prefill_s": round(prefill_s, 3), "warmup_s": round(warmup_s, 3)}


def sample(answers: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """One timed repetition: what its answers and wall time say."""
    generated = [a["meta_info"]["completion_tokens"] for a in answers]
    steps = [a["meta_info"].get("spec_verify_ct") or 0 for a in answers]
    cached = [a["meta_info"].get("cached_tokens", 0) for a in answers]
    accept = [g / s for g, s in zip(generated, steps, strict=True) if s]
    return {
        "generated_tokens": sum(generated),
        "wall_s": round(wall_s, 4),
        "cached_tokens_min": min(cached),
        "tokens_per_s": round(sum(generated) / wall_s, 2),
        "verify_steps_max": max(steps),
        "step_ms": round(wall_s * 1e3 / max(steps), 3) if max(steps) else None,
        "accept_length": round(sum(accept) / len(accept), 3) if accept else None,
        "output_ids_head": answers[0]["output_ids"][:16],
    }


def cpu_jiffies(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole host so far, in jiffies; None where unreadable."""
    try:
        fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cpus(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """How many CPUs were busy on average between two ``cpu_jiffies`` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = (after[0] - before[0]) / (after[1] - before[1])
    return round(share * (os.cpu_count() or 1), 2)


def measure(
    server: SGLangServer, prompts: list[list[int]], new_tokens: int, timeout_s: float
) -> dict[str, Any]:
    """One timed repetition of ``new_tokens`` of decode for all ``prompts`` (already cached),
    with its start as Unix time (to line it up with the GPU's clock log) and the host's load."""
    started_at, before = time.time(), cpu_jiffies()
    result = sample(*generate(server, prompts, new_tokens, timeout_s))
    return {**result, "started_at": started_at, "host_busy_cpus": busy_cpus(before, cpu_jiffies())}


def shape_record(
    samples: list[dict[str, Any]], warm: dict[str, float], positions: list[int]
) -> dict[str, Any]:
    """A record of one server at one shape from its timed repetitions (in measured order)."""
    first = samples[0]
    heads = [s["output_ids_head"] for s in samples]
    return {
        **summarize(samples),
        "generated_tokens": first["generated_tokens"],
        "cached_tokens_min": min(s["cached_tokens_min"] for s in samples),
        **warm,
        "order_positions": positions,
        "outputs_identical_across_repeats": all(h == heads[0] for h in heads),
        "output_ids_head": first["output_ids_head"],
        "samples": [{k: s[k] for k in SAMPLE_FIELDS} for s in samples],
    }


def records_in_log(text: str) -> list[dict[str, Any]]:
    """The records a run printed, in order: what its log keeps if it was cut before speed.json."""
    return [
        json.loads(line.removeprefix(RECORD_PREFIX))
        for line in text.splitlines()
        if line.startswith(RECORD_PREFIX + "{")
    ]


@dataclass(frozen=True)
class Configuration:
    """One server of a speed run: a mode of ``MODES`` under one speculative algorithm and, for
    DDTree, one budget. ``name`` is unique in the run (its server is ``speed_<name>``); a record
    names ``mode`` as its ``configuration`` and the algorithm and budget in its server's
    description, so the committed record keys it like any other row."""

    name: str
    mode: str
    spec: str = "eagle"
    budget: int = DDTREE_BUDGET


def configurations(
    modes: list[str], specs: list[str], budgets: list[int] | None = None
) -> list[Configuration]:
    """Every (algorithm, budget, mode) a run measures: each algorithm's and budget's modes side
    by side, so that ``mode_order``'s reversal keeps an ``off`` next to its ``on``. A name is the
    mode, with the algorithm where several run and the budget where several DDTree budgets do."""
    budgets = budgets or [DDTREE_BUDGET]
    found = []
    for spec in specs:
        for budget in budgets if spec == "ddtree" else [DDTREE_BUDGET]:
            for mode in modes:
                name = mode + (f"_{spec}" if len(specs) > 1 else "")
                name += f"_b{budget}" if spec == "ddtree" and len(budgets) > 1 else ""
                found.append(Configuration(name, mode, spec, budget))
    return found


def speed_specs(
    model: Path,
    configs: list[Configuration],
    mem_fraction: float,
    extra: tuple[str, ...],
    tp: int = 1,
    graph_max_bs: int = GRAPH_MAX_BS,
    eagle_shape: str = "tree",
    draft: Path | None = None,
    block_size: int = DFLASH_BLOCK_SIZE,
    draft_window: int | None = None,
    draft_attention: str | None = None,
    kv_dtype: str = "bfloat16",
    cuda_graphs: bool = True,
) -> list[ServerSpec]:
    """The servers of ``configs``; the draft model and its options go to the algorithms that
    serve one (the draft window to DFlash's alone), ``eagle_shape`` (tree or chain) to EAGLE's."""
    specs = []
    for config in configs:
        has_draft = config.spec in DRAFT_MODEL_SPECS
        specs.append(
            ServerSpec(
                f"speed_{config.name}",
                MODES[config.mode][0],
                model,
                speculation={"dflash": DFLASH, "ddtree": DDTREE}.get(config.spec, eagle_shape),
                draft=draft if has_draft else None,
                block_size=block_size,
                draft_window=draft_window if config.spec == "dflash" else None,
                budget=config.budget,
                draft_attention=draft_attention if has_draft else None,
                kv_dtype=kv_dtype,
                cuda_graphs=cuda_graphs,
                mem_fraction=mem_fraction,
                extra=extra,
                env=MODES[config.mode][1],
                tp=tp,
                graph_max_bs=graph_max_bs,
            )
        )
    return specs


def kv_tokens_need(args: argparse.Namespace, specs: list[ServerSpec]) -> int:
    """KV slots the largest measured shape holds in the widest of ``specs``' servers, counting
    the longest generation a shape runs (timed, warm-up or profiled)."""
    width = max(spec.verify_width for spec in specs)
    new_tokens = max(args.new_tokens, args.warmup_tokens, args.profile_tokens)
    return max(
        kv_tokens_needed(batch, prompt_len, new_tokens, width)
        for prompt_len, batch in measured_shapes(args)
    )


def run_server_specs(args: argparse.Namespace, configs: list[Configuration]) -> list[ServerSpec]:
    """The servers of ``configs`` as the arguments ask, their KV pools capped by --kv-tokens."""
    specs = speed_specs(
        args.model,
        configs,
        args.mem_fraction,
        tuple(args.server_arg),
        tp=args.tp,
        graph_max_bs=args.graph_max_bs,
        eagle_shape=args.speculation,
        draft=args.draft,
        block_size=args.block_size,
        draft_window=args.draft_window,
        draft_attention=args.draft_attention_backend,
        kv_dtype=KV_DTYPE_NAMES[args.kv_dtype],
        cuda_graphs=not args.no_cuda_graphs,
    )
    if args.kv_tokens is None:
        return specs
    cap = kv_pool_cap(kv_tokens_need(args, specs)) if args.kv_tokens == "auto" else args.kv_tokens
    return [dataclasses.replace(spec, kv_tokens=cap) for spec in specs]


def measured_shapes(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(prompt_len, batch) of every shape measured: ``--shapes``, else batches x prompt lengths."""
    return args.shapes or [(p, b) for p in args.prompt_lens for b in args.batches]


def draft_mask_token(draft_config: dict[str, Any] | None) -> frozenset[int]:
    """The DFlash draft's mask token id (from its config.json), which prompts leave out (empty
    without a draft)."""
    if draft_config is None:
        return frozenset()
    token = draft_config.get("dflash_config", {}).get("mask_token_id")
    return frozenset() if token is None else frozenset({int(token)})


def run_speed(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((args.model / "config.json").read_text())
    kv_dtype = KV_DTYPE_NAMES[args.kv_dtype]
    configs = configurations(args.modes, args.spec, args.budget)
    specs = run_server_specs(args, configs)
    draft = None if args.draft is None else json.loads((args.draft / "config.json").read_text())
    avoid = draft_mask_token(draft)
    model_name = made_model_name(config, args.model.name)
    servers, failed = start_all(
        specs, out, args.start_timeout, wave=args.start_wave, pools_wait_s=args.pools_wait
    )
    launchers = {name: s.proc.pid for name, s in servers.items()}
    # What each server holds once all run, and once the shapes are measured (the memory plan's
    # weights + pool + graphs, read per process rather than from SGLang's free-memory deltas).
    gpu_memory: dict[str, Any] = {"ready": servers_mib(launchers)}
    records: list[dict[str, Any]] = []
    profile: dict[str, Any] | None = None

    def keep(shape_records: list[dict[str, Any]]) -> None:
        for record in shape_records:
            record.update(model=model_name, kv_dtype=kv_dtype)
            print(RECORD_PREFIX + json.dumps(record), flush=True)
            records.append(record)

    def write_result(complete: bool) -> dict[str, Any]:
        result = speed_result(args, config, draft, records, profile, servers, complete)
        result["gpu_memory_mib"] = gpu_memory
        (out / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
        return result

    try:
        if failed:
            raise SystemExit(f"servers failed to start: {sorted(failed)}; logs in {out}")
        sampling = (
            HostSampler(
                {name.removeprefix("speed_"): pid for name, pid in launchers.items()},
                out / "host_samples",
            )
            if args.host_samples
            else contextlib.nullcontext()
        )
        with sampling:
            for index, (prompt_len, batch) in enumerate(measured_shapes(args)):
                prompts = random_prompts(
                    batch, prompt_len, config["vocab_size"], prompt_len + batch, avoid
                )
                try:
                    shape_records = measure_shape(servers, configs, args, prompts, index)
                except MeasurementCut as cut:
                    keep(cut.records)
                    write_result(complete=False)
                    raise
                keep(shape_records)
                if args.profile_shape == (prompt_len, batch):
                    profile = profile_shape(servers, configs, args, prompts)
                # What is measured so far, in case the run is cut (a device command's limit).
                write_result(complete=False)
        metrics = {name: s.get("/metrics") for name, s in servers.items()}
        gpu_memory["measured"] = servers_mib(launchers)
    finally:
        stop_all(servers)
    for name, text in metrics.items():
        (out / f"metrics_{name}.txt").write_text(text)
    return write_result(complete=True)


def speed_result(
    args: argparse.Namespace,
    config: dict[str, Any],
    draft_config: dict[str, Any] | None,
    records: list[dict[str, Any]],
    profile: dict[str, Any] | None,
    servers: dict[str, SGLangServer],
    complete: bool,
) -> dict[str, Any]:
    """speed.json: the model, the method, the records so far; ``complete`` once every shape is.
    ``config`` and ``draft_config`` are the target's and the draft's config.json (read once)."""
    return {
        "model": config.get("kdtree_model"),
        "model_config": {
            k: config.get(k)
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "q_lora_rank",
                "kv_lora_rank",
                "n_routed_experts",
                "num_experts_per_tok",
                "vocab_size",
                "max_position_embeddings",
            )
        },
        "draft": None if draft_config is None else draft_config.get("kdtree_model"),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "warmup_tokens": args.warmup_tokens,
        "complete": complete,
        "records": records,
        "profile": profile,
        "ready_after_s": {n: s.ready_after_s for n, s in servers.items()},
    }


def profile_shape(
    servers: dict[str, SGLangServer],
    configs: list[Configuration],
    args: argparse.Namespace,
    prompts: list[list[int]],
) -> dict[str, Any]:
    """One profiled generation per configuration at an already measured (cached, warm) shape;
    the side-by-side table goes to OUT/profile/profile.md and into the returned record."""
    folder = args.out / "profile"
    times, steps, runs = {}, {}, {}
    for name in (c.name for c in configs):
        server = servers[f"speed_{name}"]
        done = profile_decode(
            server,
            lambda server=server: generate(
                server, prompts, args.profile_tokens, args.request_timeout
            ),
            folder / name,
            args.request_timeout,
        )
        times[name], steps[name] = merged_times(done.traces), done.verify_steps
        runs[name] = {
            "traces": [str(t.relative_to(args.out)) for t in done.traces],
            "verify_steps": done.verify_steps,
            "generated_tokens": done.generated_tokens,
            "wall_s": done.wall_s,
        }
    table = comparison(times, steps)
    header = (
        f"# GPU time per verify step: batch {len(prompts)}, {len(prompts[0])}-token prompts, "
        f"{args.profile_tokens} new tokens (SGLang's profiler, one generation per server)\n\n"
    )
    (folder / "profile.md").write_text(header + comparison_markdown(table))
    print(f"[e2e] profile: {folder / 'profile.md'}", flush=True)
    return {
        "batch": len(prompts),
        "prompt_len": len(prompts[0]),
        "new_tokens": args.profile_tokens,
        "runs": runs,
        **table,
    }


def measurement_plan(names: list[str], shape: int, repeats: int) -> list[tuple[str, int, str]]:
    """What one shape's measurement does, in order: ``("warmup", -1, name)`` for every
    configuration, then ``("timed", repeat, name)`` for each repetition, in ``mode_order``."""
    plan = [("warmup", -1, name) for name in mode_order(names, shape, 0)]
    for repeat in range(repeats):
        plan += [("timed", repeat, name) for name in mode_order(names, shape, repeat)]
    return plan


class MeasurementCut(KeyboardInterrupt):
    """SIGINT (the run's time limit) during a shape: ``records`` keep what it measured."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        super().__init__("measurement cut")
        self.records = records


def measure_shape(
    servers: dict[str, SGLangServer],
    configs: list[Configuration],
    args: argparse.Namespace,
    prompts: list[list[int]],
    shape: int,
) -> list[dict[str, Any]]:
    """Run ``measurement_plan`` for these prompts; one record per configuration. A server whose
    call fails is left out of the rest of the shape, its record keeping what it measured. Cut
    by SIGINT, it raises ``MeasurementCut`` with the records of the repetitions done, so a long
    shape's first mode survives a limit that falls during its second."""
    batch, prompt_len = len(prompts), len(prompts[0])
    names = [c.name for c in configs]
    warm: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    samples: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    positions: dict[str, list[int]] = {n: [] for n in names}
    cut = False
    try:
        for phase, repeat, name in measurement_plan(names, shape, args.repeats):
            if name in errors:
                continue
            server = servers[f"speed_{name}"]
            try:
                if phase == "warmup":
                    warm[name] = warm_up(server, prompts, args.warmup_tokens, args.request_timeout)
                else:
                    samples[name].append(
                        measure(server, prompts, args.new_tokens, args.request_timeout)
                    )
                    positions[name].append(mode_order(names, shape, repeat).index(name))
            except (RuntimeError, OSError) as error:
                errors[name] = f"{phase} {repeat}: {error}" if phase == "timed" else str(error)
    except KeyboardInterrupt:
        cut = True
        for name in names:
            if len(samples[name]) < args.repeats and name not in errors:
                errors[name] = f"cut after {len(samples[name])} of {args.repeats} timed repetitions"
    records = []
    for config in configs:
        server = servers[f"speed_{config.name}"]
        record: dict[str, Any] = {
            "batch": batch,
            "prompt_len": prompt_len,
            "new_tokens": args.new_tokens,
        }
        if samples[config.name]:
            record.update(
                shape_record(samples[config.name], warm[config.name], positions[config.name])
            )
        if config.name in errors:
            record["error"] = errors[config.name]
        record.update(
            mode=server.spec.mode,
            configuration=config.mode,
            spec=server.spec.spec,
            server=server.spec.describe(),
            server_flags=server.spec.flags(server.port),
            log=server.log_path.name,
        )
        records.append(record)
    if cut:
        raise MeasurementCut(records)
    return records


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory (make_model.py)")
    parser.add_argument("--out", type=Path, required=True, help="logs and speed.json go here")
    parser.add_argument("--batches", type=parse_ints, default=[1, 8])
    parser.add_argument("--prompt-lens", type=parse_ints, default=[1024, 8192, 32768])
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=None,
        help="BxP,... (batch x prompt tokens), in this order, instead of --batches x --prompt-lens",
    )
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per shape")
    parser.add_argument(
        "--warmup-tokens", type=int, default=64, help="tokens of the untimed warm-up generation"
    )
    parser.add_argument(
        "--modes",
        type=lambda text: [m for m in text.split(",") if m],
        default=list(DEFAULT_MODES),
        help=f"comma-separated, from {', '.join(MODES)} (default: {','.join(DEFAULT_MODES)})",
    )
    parser.add_argument(
        "--spec",
        type=parse_specs,
        default=["eagle"],
        help="speculative algorithms, comma-separated, each with every mode "
        f"(from {', '.join(SPECS)}; ddtree: the DFlash draft's tree, --budget nodes)",
    )
    parser.add_argument(
        "--speculation", choices=("tree", "chain"), default="tree", help="EAGLE's draft shape"
    )
    parser.add_argument(
        "--draft", type=Path, help="DFlash draft model directory (--spec dflash or ddtree)"
    )
    parser.add_argument(
        "--budget",
        type=parse_ints,
        default=[DDTREE_BUDGET],
        help="DDTree: draft-tree nodes verified per step, comma-separated for a server pair "
        f"per budget, all started together (default {DDTREE_BUDGET})",
    )
    parser.add_argument(
        "--block-size", type=int, default=DFLASH_BLOCK_SIZE, help="DFlash tokens per verify"
    )
    parser.add_argument(
        "--draft-window",
        type=int,
        default=None,
        help="DFlash: the draft attends to the last N tokens only "
        "(SGLang's --speculative-draft-window-size); default: the whole context",
    )
    parser.add_argument(
        "--draft-attention-backend",
        choices=DRAFT_ATTENTION_BACKENDS,
        default=None,
        help="DFlash, DDTree: the draft model's attention backend "
        "(SGLang's --speculative-draft-attention-backend); default: SGLang's choice",
    )
    parser.add_argument(
        "--kv-dtype", choices=sorted(KV_DTYPE_NAMES), default="bf16", help="KV cache dtype"
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every server")
    parser.add_argument("--mem-fraction", type=float, default=0.12)
    parser.add_argument(
        "--kv-tokens",
        type=kv_tokens_arg,
        default=None,
        help="cap every server's KV pool (SGLang's --max-total-tokens): a number of tokens, or "
        "auto, what the largest shape needs plus a tenth (at least 4,096); default: SGLang "
        "sizes each pool from --mem-fraction",
    )
    parser.add_argument(
        "--graph-max-bs",
        type=int,
        default=GRAPH_MAX_BS,
        help=f"decode CUDA graphs for batches 1..N; larger ones run eagerly (default {GRAPH_MAX_BS})",
    )
    parser.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="decode eagerly at every batch size (--cuda-graph-backend-decode disabled)",
    )
    parser.add_argument(
        "--profile-shape",
        type=lambda text: parse_shapes(text)[0],
        default=None,
        help="BxP: after this measured shape's timing, one generation per server under SGLang's "
        "profiler (traces and a per-kernel table in OUT/profile/)",
    )
    parser.add_argument(
        "--profile-tokens", type=int, default=64, help="tokens of the profiled generation"
    )
    parser.add_argument(
        "--host-samples",
        action="store_true",
        help="py-spy on every server's scheduler while the shapes are measured: raw samples "
        "and a table of where the host time went in OUT/host_samples/ (bench/kdtree_bench/profiling/host_samples.py)",
    )
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument(
        "--start-wave",
        type=int,
        default=0,
        help="servers started together (0: all); 1 starts each once the one before is ready",
    )
    parser.add_argument(
        "--pools-wait",
        type=float,
        default=POOLS_WAIT_S,
        help="the servers start together, each scheduler held at its start gate after its "
        "imports; each gate opens once the server before holds its memory pools, or after this "
        "many seconds at most (SGLang sizes its pool from the memory free when it measures, and "
        "refuses to start when another server took it meanwhile); 0: no gates, 3 s apart",
    )
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="one more SGLang argument (repeatable)"
    )
    return parser


def kv_tokens_arg(text: str) -> int | str:
    """``--kv-tokens``: ``auto`` or a positive number of tokens."""
    if text == "auto":
        return text
    try:
        tokens = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither auto nor a number of tokens"
        ) from None
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 token, got {tokens}")
    return tokens


def refusal(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot run (one line), or None."""
    if not (args.model / "config.json").is_file():
        return f"no config.json in {args.model}"
    for name in ("tp", "graph_max_bs", "repeats", "warmup_tokens", "new_tokens", "profile_tokens"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
    if args.start_wave < 0:
        return f"--start-wave must be 0 (all at once) or more, got {args.start_wave}"
    if args.pools_wait < 0:
        return f"--pools-wait must be 0 (off) or more seconds, got {args.pools_wait}"
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown or not args.modes:
        return f"--modes: unknown {unknown}; choose from {list(MODES)}"
    specs = set(args.spec)
    if specs & set(DRAFT_MODEL_SPECS):
        if args.draft is None:
            return f"--spec {','.join(args.spec)} needs --draft DIR (make_dflash_draft.py)"
        if not (args.draft / "config.json").is_file():
            return f"no config.json in the draft {args.draft}"
    elif args.draft is not None:
        return "--draft is a DFlash draft: use it with --spec dflash or ddtree"
    if "ddtree" not in specs and args.budget != [DDTREE_BUDGET]:
        return "--budget is DDTree's: use it with --spec ddtree"
    if len(set(args.budget)) != len(args.budget):
        return f"--budget names a budget twice: {args.budget}"
    if "dflash" in specs and args.block_size < 2:
        return f"--block-size must be at least 2, got {args.block_size}"
    if args.draft_window is not None:
        if "dflash" not in specs:
            return (
                "--draft-window is DFlash's: use it with --spec dflash "
                "(DDTree's draft reads the whole context)"
            )
        if args.draft_window < args.block_size:
            return (
                f"--draft-window {args.draft_window} is smaller than the block ({args.block_size})"
            )
    if args.draft_attention_backend is not None and not specs & set(DRAFT_MODEL_SPECS):
        return (
            "--draft-attention-backend is a draft model's: use it with --spec dflash or ddtree "
            f"(--spec {','.join(args.spec)} has no draft model)"
        )
    if args.host_samples and shutil.which("py-spy") is None:
        return "--host-samples needs py-spy on PATH (docs/development.md)"
    if args.profile_shape is not None and args.profile_shape not in measured_shapes(args):
        prompt_len, batch = args.profile_shape
        return f"--profile-shape {batch}x{prompt_len} is not one of the measured shapes"
    if isinstance(args.kv_tokens, int):
        need = kv_tokens_need(
            args, run_server_specs(args, configurations(args.modes, args.spec, args.budget))
        )
        if args.kv_tokens < need:
            return (
                f"--kv-tokens {args.kv_tokens} cannot hold the largest shape, which needs {need} "
                "KV slots (batch x (prompt + new tokens + twice the verify width)); raise it or "
                "use auto"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    why = refusal(args)
    if why is not None:
        print(f"sglang_e2e: {why}", file=sys.stderr)
        return 2
    run_speed(args)
    return 0


if __name__ == "__main__":
    sigint_interrupts()
    sys.exit(main())
