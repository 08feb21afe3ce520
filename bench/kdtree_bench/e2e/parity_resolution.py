#!/usr/bin/env python3
"""The parity gate's resolution, measured: graded faults x corpus size -> verdict.

Starts real reference-engine servers on loopback (``kdtree-engine``): one baseline and, one at a
time, each candidate: an identical twin, the equivalent-numerics candidate (``KDTREE_VERIFY=on``:
the verify op, float32 with another summation order) and a candidate per fault x size
(``KDTREE_INJECT_FAULT``, see ``kdtree_inference.faults``). Every candidate is judged by the real
gate (``kdtree-parity run``, the A/A twin being the baseline replayed a second time) on the first
K prompts of a corpus for each K in ``--corpus-sizes``. Writes to ``--out``:

- ``resolution.json``: the policy and corpus used, every cell (candidate, corpus size, verdict,
  the figures that decided it) and, per fault kind, the smallest size that failed at each corpus
  size and the largest that passed; rewritten after every cell (``"complete": false`` until the
  grid ends), so a run cut short keeps what it measured;
- ``resolution.md``: the same as tables;
- ``raw.tar.xz``: ``raw/``, every server's log, every gate run's stdout/stderr and its report
  directory (left unpacked if the grid fails).

The corpus for K prompts is the shipped ``short`` corpus followed by the ``default`` corpus, its
first K entries. The policy is ``--policy`` (default ``short``) with ``gate.min_prompts`` set to
the smallest corpus size, so that every size can be decided (stated in the output).

    .venv/bin/python -m kdtree_bench.e2e.parity_resolution                      # the committed grid
    .venv/bin/python -m kdtree_bench.e2e.parity_resolution --corpus-sizes 24 --faults scale:0.001
    python3 -m kdtree_bench.e2e.parity_resolution --servers sglang --policy default ...   # GPU machine
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kdtree_bench.e2e.sglang_servers import (
    POOLS_WAIT_S,
    PRESET_MEM_FRACTION,
    ServerSpec,
    SGLangServer,
    sigint_interrupts,
    start_all,
    stop_all,
)
from kdtree_inference.engine.launch import EngineProcess
from kdtree_inference.faults import ENV_VAR, parse_fault
from kdtree_parity.corpus import load_corpus
from kdtree_parity.policy import BUILTIN_POLICIES, builtin_policy_path, parse_policy

DEFAULT_OUT = Path("bench/results/parity_resolution")
DEFAULT_SIZES = (12, 24, 40)
# Sizes bracket each kind's threshold under the shipped short policy (see docs/parity.md).
DEFAULT_FAULTS = (
    "scale:0.0001",
    "scale:0.0002",
    "scale:0.001",
    "weight:1:0.00003",
    "weight:1:0.0001",
    "weight:1:0.001",
    "kv_drop:48",
    "kv_drop:32",
    "kv_drop:16",
    "tree_mask:7",
    "tree_mask:3",
    "tree_mask:0",
    "layer_scale:1:0.02",
)
# ``layer_scale:L:S``: one layer's attention output scaled by (1 + S), through the reference
# engine's ``--fault-layer L --fault-scale 1+S`` or, on SGLang, a model copy with that layer's
# ``o_proj`` scaled (a systematic fault: it biases the logprobs in one direction, which rounding
# noise does not).
LAYER_SCALE = "layer_scale"
# Candidates that must pass: the same server again, and the same model with other numerics.
CONTROLS = {"identical": {}, "equivalent_numerics": {"KDTREE_VERIFY": "on"}}


@dataclass(frozen=True)
class Candidate:
    name: str  # "identical", "equivalent_numerics" or a fault's KDTREE_INJECT_FAULT value
    env: dict[str, str]
    kind: str | None = None  # the fault kind, None for a control
    size: float | None = None
    options: dict = field(default_factory=dict)  # server options (the A/A' floor's control)


@dataclass
class Cell:
    candidate: str
    kind: str | None
    size: float | None
    prompts: int
    verdict: str
    exit_code: int
    failed_rules: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Floor:
    """An A/A' floor: the baseline started with ``options`` (an equivalent, not bit-identical
    computation) for a gate that takes ``--floor``. ``name`` also names the candidate that
    starts the same configuration in a process of its own, which must pass against it."""

    name: str
    options: dict
    label: str


def kv_splits_floor(splits: int) -> Floor:
    """The reference engine's floor: attention in ``splits`` key chunks merged by log-sum-exp."""
    return Floor(
        f"kv_splits_{splits}",
        {"attention_kv_splits": splits},
        f"baseline with --attention-kv-splits {splits}",
    )


# SGLang's floor: EAGLE's chain instead of its tree. Greedy tokens do not depend on the draft,
# and other accept lengths put each token's keys at other tile boundaries and prefix/draft
# splits of the target's verify attention (docs/parity.md, "How to choose A/A'").
CHAIN_FLOOR = Floor(
    "eagle_chain", {"speculation": "chain"}, "baseline with EAGLE's chain (top-k 1)"
)


def candidates(
    faults: list[str], floor: Floor | None = None, controls: bool = True
) -> list[Candidate]:
    """The controls (plus, with a ``floor``, its configuration as a candidate) unless
    ``controls`` is False, then one candidate per fault."""
    out = []
    if controls:
        out += [
            Candidate(name, {"KDTREE_VERIFY": "off", ENV_VAR: "", **env})
            for name, env in CONTROLS.items()
        ]
    if floor and controls:
        out.append(
            Candidate(floor.name, {"KDTREE_VERIFY": "off", ENV_VAR: ""}, options=floor.options)
        )
    for spec in faults:
        if spec.startswith(f"{LAYER_SCALE}:"):
            layer, size = layer_scale(spec)
            options = {"fault_layer": layer, "fault_scale": 1 + size}
            stock = {"KDTREE_VERIFY": "off", ENV_VAR: ""}
            out.append(Candidate(spec, stock, LAYER_SCALE, size, options=options))
            continue
        fault = parse_fault(spec)  # refuses a malformed grid before any server starts
        out.append(Candidate(spec, {"KDTREE_VERIFY": "off", ENV_VAR: spec}, fault.kind, fault.size))
    return out


def layer_scale(spec: str) -> tuple[int, float]:
    """``layer_scale:L:S`` -> (L, S); ValueError names a malformed value."""
    parts = spec.split(":")
    try:
        layer, size = int(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        raise ValueError(f"{spec!r}: expected {LAYER_SCALE}:LAYER:SIZE") from None
    if len(parts) != 3 or layer < 0 or not 0 < abs(size) < 1:
        raise ValueError(f"{spec!r}: expected {LAYER_SCALE}:LAYER:SIZE, 0 < |SIZE| < 1")
    return layer, size


def write_corpus(path: Path, prompts: int) -> Path:
    lines = []
    for name in ("short", "default"):
        lines += load_corpus(name).raw.decode().splitlines()
    if prompts > len(lines):
        raise SystemExit(f"parity_resolution: at most {len(lines)} prompts, got {prompts}")
    path.write_text("\n".join(lines[:prompts]) + "\n")
    return path


def write_policy(path: Path, base: str, min_prompts: int) -> tuple[Path, dict]:
    source = builtin_policy_path(base) if base in BUILTIN_POLICIES else Path(base)
    data = yaml.safe_load(source.read_text()) or {}
    data.setdefault("gate", {})["min_prompts"] = min_prompts
    # The table measures numerical faults: the speed rule (judged on its own, docs/parity.md)
    # would make a verdict depend on how busy the machine's cores were, and accept length (also
    # judged on its own) follows from the tokens the table already judges.
    data["gate"]["max_slowdown"] = None
    data["gate"]["max_accept_length_drop"] = None
    text = yaml.safe_dump(data, sort_keys=False)
    parse_policy(text)
    path.write_text(text)
    return path, data


def figures(report: dict) -> dict:
    """The numbers that decide a verdict, from report.json: candidate vs baseline and excess."""
    summary = report.get("summary") or {}
    cand = summary.get("candidate") or {}
    drift = cand.get("drift") or {}
    return {
        "compared": cand.get("compared"),
        "exact_rate": cand.get("exact_rate"),
        "divergence_rate": cand.get("divergence_rate"),
        "hard": cand.get("hard"),
        "near_tie": cand.get("near_tie"),
        "drift_p99": drift.get("p99"),
        "drift_max": drift.get("max"),
        "excess": summary.get("excess"),
    }


def failed_rules(report: dict) -> list[str]:
    reasons = (report.get("verdict") or {}).get("reasons") or []
    return [r["rule"] for r in reasons if r.get("outcome") != "pass"]


def judge(
    baseline: str,
    candidate: str,
    corpus: Path,
    policy: Path,
    raw: Path,
    tag: str,
    floor: str | None = None,
) -> tuple[int, dict]:
    out = raw / "runs" / tag
    cmd = [
        sys.executable,
        "-m",
        "kdtree_parity.cli",
        "run",
        "--baseline",
        baseline,
        "--candidate",
        candidate,
        "--corpus",
        str(corpus),
        "--policy",
        str(policy),
        "--out",
        str(out),
        "--db",
        str(raw / "runs.sqlite3"),
        "--no-progress",
        *(["--floor", floor] if floor else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    (raw / "gate" / f"{tag}.stdout").write_text(proc.stdout)
    (raw / "gate" / f"{tag}.stderr").write_text(proc.stderr)
    reports = sorted(out.glob("*/report.json"))
    report = json.loads(reports[-1].read_text()) if reports else {}
    return proc.returncode, report


@contextlib.contextmanager
def engine_server(
    raw: Path, tag: str, env: dict[str, str], options: dict | None = None
) -> Iterator[str]:
    """A reference-engine server on loopback with ``env`` and CLI ``options``; yields its URL."""
    server = EngineProcess(raw / "servers" / f"{tag}.log", env=env, **(options or {}))
    try:
        server.wait()
        yield server.url
    finally:
        server.stop()


StartServer = Callable[..., contextlib.AbstractContextManager[str]]

ServerWanted = tuple[str, dict[str, str], dict | None]
"""A server to start: its tag, its environment and its options."""


class SGLangServers:
    """A ``start_server`` for real SGLang servers (``bench/kdtree_bench/e2e/sglang_servers.py``) on
    the GPU machine: the ``preset`` model written to ``model_dir`` by
    ``bench/kdtree_bench/models/make_model.py``, EAGLE tree speculation, radix cache off
    (deterministic at concurrency 1) and eager forwards (``kv_drop``/``tree_mask`` faults cannot
    be captured in CUDA graphs; the baseline runs eager too, so every candidate is compared at the
    same numerics). ``KDTREE_INJECT_FAULT=weight:..`` serves a perturbed model copy
    (``make_model.py --perturb``) with KDTREE_VERIFY=off; the other faults run KDTREE_VERIFY=on
    with the variable set. Each server takes ``mem_fraction`` of the GPU, by default the
    preset's (``PRESET_MEM_FRACTION``) or ServerSpec's. Calling it starts one server;
    ``together`` starts several at once."""

    def __init__(
        self,
        model_dir: Path,
        preset: str,
        timeout_s: float = 900.0,
        mem_fraction: float | None = None,
    ) -> None:
        self.model_dir, self.preset, self.timeout_s = model_dir, preset, timeout_s
        if mem_fraction is None:
            mem_fraction = PRESET_MEM_FRACTION.get(preset, ServerSpec.mem_fraction)
        self.mem_fraction = mem_fraction
        if not (model_dir / "model.safetensors").is_file():
            self._write_model(model_dir)

    def _write_model(self, model: Path, **change) -> dict:
        from kdtree_bench.models import make_model

        return make_model.write_model(model, self.preset, device="cuda", **change)

    def spec(self, tag: str, env: dict[str, str], options: dict | None = None) -> ServerSpec:
        """The ServerSpec of server ``tag`` (writing its model copy first where its fault needs
        one)."""
        options = dict(options or {})
        scale_output = None
        if "fault_layer" in options:  # layer_scale: a model copy with that o_proj scaled
            scale_output = (options.pop("fault_layer"), options.pop("fault_scale") - 1)
        unknown = set(options) - {"speculation"}
        if unknown:
            raise ValueError(f"{tag}: options {sorted(unknown)} have no SGLang counterpart here")
        env = dict(env)
        model, fault = self.model_dir, parse_fault(env.get(ENV_VAR))
        copy = self.model_dir.with_name(f"{self.model_dir.name}-{tag}")
        if scale_output is not None:
            model = copy
            if not (model / "model.safetensors").is_file():
                self._write_model(model, scale_output=scale_output)
        if fault is not None and fault.kind == "weight":
            model = copy
            if not (model / "model.safetensors").is_file():
                made = self._write_model(model, perturb=(fault.layer, fault.size))
                print(f"{tag}: realized relative size {made['kdtree_model']['perturb']}")
            env[ENV_VAR] = ""
        mode = env.pop("KDTREE_VERIFY", "off")
        if fault is not None and fault.kind != "weight":
            mode = "on"
        return ServerSpec(
            name=tag,
            mode=mode,
            model=model,
            cuda_graphs=False,
            radix_cache=False,
            mem_fraction=self.mem_fraction,
            env=env,
            **options,
        )

    @contextlib.contextmanager
    def __call__(
        self, raw: Path, tag: str, env: dict[str, str], options: dict | None = None
    ) -> Iterator[str]:
        server = SGLangServer(self.spec(tag, env, options), raw / "servers")
        try:
            server.wait_ready(self.timeout_s)
            yield server.url
        finally:
            server.stop()

    @contextlib.contextmanager
    def together(self, raw: Path, wanted: list[ServerWanted]) -> Iterator[dict[str, str]]:
        """Every server of ``wanted`` started at once behind start gates (their imports overlap,
        their memory profiles take turns: ``start_all``); their URLs by tag. Raises RuntimeError,
        with each one's reason, when any did not start."""
        specs = [self.spec(tag, env, options) for tag, env, options in wanted]
        servers, failed = start_all(
            specs, raw / "servers", self.timeout_s, pools_wait_s=POOLS_WAIT_S
        )
        try:
            if failed:
                raise RuntimeError(f"servers that did not start: {failed}")
            yield {tag: server.url for tag, server in servers.items()}
        finally:
            stop_all(servers)


@contextlib.contextmanager
def one_after_another(
    start: StartServer, raw: Path, wanted: list[ServerWanted]
) -> Iterator[dict[str, str]]:
    """Every server of ``wanted`` started with ``start``, each once the one before answers;
    their URLs by tag."""
    with contextlib.ExitStack() as stack:
        yield {tag: stack.enter_context(start(raw, tag, env, opts)) for tag, env, opts in wanted}


def prepare_raw(raw: Path, sizes: list[int], policy_name: str) -> tuple[dict, Path, dict]:
    """The raw folder a grid writes into, empty of an earlier run's database: the corpus of
    each size, and the policy file with its settings."""
    for sub in ("servers", "gate", "runs"):
        (raw / sub).mkdir(parents=True, exist_ok=True)
    (raw / "runs.sqlite3").unlink(missing_ok=True)
    corpora = {k: write_corpus(raw / f"corpus_{k}.jsonl", k) for k in sizes}
    policy, policy_data = write_policy(raw / "policy.yaml", policy_name, min(sizes))
    return corpora, policy, policy_data


def pack_raw_folder(out: Path, raw: Path) -> None:
    """Hundreds of small logs travel as one archive, ``raw.tar.xz``; the folder goes."""
    with tarfile.open(out / "raw.tar.xz", "w:xz") as archive:
        archive.add(raw, arcname="raw")
    shutil.rmtree(raw)


def measure(
    faults: list[str],
    sizes: list[int],
    out: Path,
    policy_name: str,
    log=print,
    start_server: StartServer = engine_server,
    servers: str = "reference engine",
    floor: Floor | None = None,
    pack_raw: bool = True,
    controls: bool = True,
) -> dict:
    """Run the grid; return (and write to ``out``, after every cell) the table; ``pack_raw``:
    the raw folder becomes ``raw.tar.xz``. ``start_server(raw, tag, env, options)`` starts one
    server (the baseline: tag ``baseline``) and yields its URL. ``floor``: also start that A/A'
    floor, judge every candidate against it, and add its configuration as a candidate.
    ``controls=False`` leaves the candidates that must pass out (a grid of faults only, for a
    device lease too short for both)."""
    raw = out / "raw"
    corpora, policy, policy_data = prepare_raw(raw, sizes, policy_name)
    cells: list[Cell] = []
    started = time.monotonic()
    stock = {"KDTREE_VERIFY": "off", ENV_VAR: ""}
    out.mkdir(parents=True, exist_ok=True)

    def table(complete: bool) -> dict:
        done = {
            "servers": servers,
            "floor": floor.label if floor else None,
            "policy": {"base": policy_name, "min_prompts": min(sizes), "settings": policy_data},
            "corpus": "first K prompts of short + default",
            "corpus_sizes": sizes,
            "max_new_tokens": policy_data.get("replay", {}).get("max_new_tokens"),
            "elapsed_s": round(time.monotonic() - started, 1),
            "complete": complete,
            "cells": [cell.__dict__ for cell in cells],
            "resolution": resolution(cells, sizes),
        }
        (out / "resolution.json").write_text(json.dumps(done, indent=2) + "\n")
        (out / "resolution.md").write_text(markdown(done))
        return done

    with contextlib.ExitStack() as stack:
        baseline = stack.enter_context(start_server(raw, "baseline", stock))
        floor_url = None
        if floor:
            floor_url = stack.enter_context(start_server(raw, "floor", stock, floor.options))
        for cand in candidates(faults, floor, controls):
            tag = cand.name.replace(":", "_")
            with start_server(raw, tag, cand.env, cand.options) as url:
                for k in sizes:
                    code, report = judge(
                        baseline, url, corpora[k], policy, raw, f"{tag}_{k}", floor_url
                    )
                    verdict = (report.get("verdict") or {}).get("status") or "error"
                    cell = Cell(
                        cand.name,
                        cand.kind,
                        cand.size,
                        k,
                        verdict,
                        code,
                        failed_rules(report),
                        figures(report),
                    )
                    cells.append(cell)
                    log(
                        f"{cand.name:>22} x {k:>3} prompts: {verdict} (exit {code}) "
                        f"{cell.failed_rules}"
                    )
                    table(complete=False)
    final = table(complete=True)
    if pack_raw:  # (the raw folder stays if anything above fails)
        pack_raw_folder(out, raw)
    return final


def resolution(cells: list[Cell], sizes: list[int]) -> dict:
    """Per kind and corpus size: the smallest faulty size that failed and the largest that
    passed. A kv_drop or tree_mask fault is worse the *smaller* its position or row, so its
    "smallest detected" is the largest position or row that failed."""
    out: dict = {}
    for kind in sorted({c.kind for c in cells if c.kind}):
        larger_is_worse = kind in ("scale", "weight", LAYER_SCALE)
        per_size = {}
        for k in sizes:
            mine = [c for c in cells if c.kind == kind and c.prompts == k]
            failed = [abs(c.size) for c in mine if c.verdict == "fail"]
            passed = [abs(c.size) for c in mine if c.verdict == "pass"]
            pick_failed, pick_passed = (min, max) if larger_is_worse else (max, min)
            per_size[str(k)] = {
                "smallest_detected": pick_failed(failed) if failed else None,
                "largest_missed": pick_passed(passed) if passed else None,
            }
        out[kind] = per_size
    return out


def markdown(table: dict) -> str:
    sizes = table["corpus_sizes"]
    lines = [
        f"# Parity gate resolution ({table.get('servers', 'reference engine')})",
        "",
        f"Policy `{table['policy']['base']}` with `gate.min_prompts: "
        f"{table['policy']['min_prompts']}`, {table['max_new_tokens']} new tokens per prompt; "
        f"corpus: {table['corpus']}. Generated by `bench/kdtree_bench/e2e/parity_resolution.py` in "
        f"{table['elapsed_s']} s.",
        "",
    ]
    if table.get("floor"):
        lines += [f"Every candidate is judged against an A/A' floor: the {table['floor']}.", ""]
    if table.get("complete") is False:
        lines += ["**Partial**: the grid stopped before its last cell; the cells below ran.", ""]
    lines += [
        "| candidate | " + " | ".join(f"{k} prompts" for k in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    by_name: dict[str, dict[int, dict]] = {}
    for cell in table["cells"]:
        by_name.setdefault(cell["candidate"], {})[cell["prompts"]] = cell
    for name, row in by_name.items():
        entries = []
        for k in sizes:
            cell = row.get(k)
            if cell is None:
                entries.append("-")
                continue
            rules = ", ".join(cell["failed_rules"])
            entries.append(f"**{cell['verdict']}**" + (f" ({rules})" if rules else ""))
        lines.append(f"| `{name}` | " + " | ".join(entries) + " |")
    lines += [
        "",
        "Smallest fault detected (kv_drop, tree_mask: the largest position/row that "
        "failed; a later position or row is a smaller fault):",
        "",
        "| kind | " + " | ".join(f"{k} prompts" for k in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for kind, per_size in table["resolution"].items():
        values = []
        for k in sizes:
            found = per_size[str(k)]["smallest_detected"]
            values.append("none failed" if found is None else f"{found:g}")
        lines.append(f"| `{kind}` | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--corpus-sizes", default=",".join(map(str, DEFAULT_SIZES)))
    p.add_argument(
        "--faults",
        default=",".join(DEFAULT_FAULTS),
        help="comma-separated KDTREE_INJECT_FAULT values",
    )
    p.add_argument("--policy", default="short", help="policy path or shipped name")
    p.add_argument(
        "--servers",
        choices=("engine", "sglang"),
        default="engine",
        help="reference engines (CPU) or real SGLang servers (GPU machine)",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=Path("/tmp/models/tiny"),
        help="sglang: the model directory (written by make_model.py if absent)",
    )
    p.add_argument("--preset", default="tiny", help="sglang: make_model.py preset")
    p.add_argument(
        "--floor-kv-splits",
        type=int,
        default=None,
        help="engine: judge against an A/A' floor, the baseline with --attention-kv-splits N",
    )
    p.add_argument(
        "--no-controls",
        action="store_true",
        help="faults only: leave out the identical, equivalent-numerics and floor candidates",
    )
    p.add_argument(
        "--floor-chain",
        action="store_true",
        help="sglang: judge against an A/A' floor, the baseline with EAGLE's chain (top-k 1)",
    )
    args = p.parse_args(argv)
    try:
        sizes = sorted({int(k) for k in args.corpus_sizes.split(",") if k.strip()})
        faults = [f.strip() for f in args.faults.split(",") if f.strip()]
        for spec in faults:
            layer_scale(spec) if spec.startswith(f"{LAYER_SCALE}:") else parse_fault(spec)
    except ValueError as exc:
        print(f"parity_resolution: {exc}", file=sys.stderr)
        return 2
    if not sizes or sizes[0] < 1:
        print("parity_resolution: --corpus-sizes needs positive integers", file=sys.stderr)
        return 2
    if args.servers == "sglang":
        start = SGLangServers(args.model_dir, args.preset)
        measure(
            faults,
            sizes,
            args.out,
            args.policy,
            start_server=start,
            servers=f"SGLang, {args.preset} model",
            floor=CHAIN_FLOOR if args.floor_chain else None,
            controls=not args.no_controls,
        )
    else:
        floor = kv_splits_floor(args.floor_kv_splits) if args.floor_kv_splits else None
        measure(faults, sizes, args.out, args.policy, floor=floor, controls=not args.no_controls)
    print(f"wrote {args.out / 'resolution.md'} and {args.out / 'resolution.json'}")
    return 0


if __name__ == "__main__":
    sigint_interrupts()
    sys.exit(main())
