"""``kdtree-selfcheck``: the kernel's correctness cases and a short benchmark on this machine's GPU.

An operator runs it on their own GPU before any gate (``docker run --gpus all
kdtree/inference:TAG kdtree-selfcheck``). It checks that the compiled extension runs on the
device it finds and matches the float32 reference (the cases below, built and judged by
``kdtree_verify.testing``, the same helpers the GPU tests use), times the kernel against SGLang's
Triton ``extend_attention_fwd`` on a few DeepSeek-V3 shapes, and writes ``selfcheck.json`` and
``selfcheck.md`` (device, sm version, pass/fail per case, times per shape) into ``--out``; the
Markdown also goes to stdout.

Exit status (``ExitCode``): OK every case passed, FAILED a case failed, REFUSED no CUDA device
or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from .exit_codes import ExitCode
from .version import add_version_flag

SCHEMA = "kdtree.selfcheck/v1"
DEFAULT_OUT = "kdtree-selfcheck"


@dataclass(frozen=True)
class CorrectnessCase:
    """One verify call on the device, judged against the float32 reference."""

    name: str
    prefix_lens: tuple[int, ...]
    num_draft: int
    num_heads: int
    mask: Literal["tree", "chain", "causal"]
    fp8: bool = False


# Every mask kind, ragged batches, prefixes on and off the kernel's tile edges (64 tokens), an
# empty prefix, long prefixes that split, the draft sizes EAGLE serves (1, 8, 16, 64), the heads
# of one DeepSeek-V3 tensor-parallel shard (16 at TP8, 128 unsharded) and the fp8 pool.
RAGGED_48 = tuple((0, 1, 65, 1000, 4097, 64)[i % 6] for i in range(48))
CASES: tuple[CorrectnessCase, ...] = (
    CorrectnessCase("single-token-draft", (1000,), 1, 16, "causal"),
    CorrectnessCase("empty-prefix-tree", (0,), 8, 16, "tree"),
    CorrectnessCase("tile-edges-ragged", (63, 64, 65), 8, 16, "tree"),
    CorrectnessCase("chain-draft", (4097,), 16, 16, "chain"),
    CorrectnessCase("wide-tree-128-heads", (1000, 1), 64, 128, "tree"),
    CorrectnessCase("long-prefix-split", (32768,), 8, 16, "tree"),
    CorrectnessCase("batch-48-mixed", RAGGED_48, 8, 8, "tree"),
    CorrectnessCase("fp8-pool-tree", (4097, 65), 8, 16, "tree", fp8=True),
)


@dataclass(frozen=True)
class BenchShape:
    """batch x heads x draft tokens x prefix, bf16, random tree mask."""

    batch: int
    heads: int
    draft: int
    prefix: int

    @property
    def name(self) -> str:
        return f"B{self.batch}-H{self.heads}-T{self.draft}-P{self.prefix}"


BENCH_SHAPES: tuple[BenchShape, ...] = (
    BenchShape(1, 16, 8, 4096),
    BenchShape(1, 16, 8, 32768),
    BenchShape(8, 16, 8, 8192),
    BenchShape(32, 16, 8, 4096),
    BenchShape(8, 128, 16, 4096),
)
QUICK_SHAPES: tuple[BenchShape, ...] = BENCH_SHAPES[:2]


# ------------------------------------------------------------------------------------ timing
def summarize_times(samples_ms: Sequence[float]) -> dict[str, float]:
    """Median and spread of per-call times in microseconds (min, max, interquartile range)."""
    if not samples_ms:
        raise ValueError("no timing samples")
    us = sorted(1000.0 * s for s in samples_ms)
    if len(us) >= 2:
        q1, _, q3 = statistics.quantiles(us, n=4, method="inclusive")
    else:
        q1 = q3 = us[0]
    return {
        "median_us": statistics.median(us),
        "min_us": us[0],
        "max_us": us[-1],
        "iqr_us": q3 - q1,
        "repeats": len(us),
    }


def time_cuda(fn: Callable[[], object], warmup: int, repeats: int) -> dict[str, float]:
    """``fn`` timed with CUDA events, one pair per call, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return summarize_times(samples)


# ------------------------------------------------------------------------------------ running
def run_case(case: CorrectnessCase, device: torch.device, seed: int = 0) -> dict[str, Any]:
    """Build the case on ``device`` (bf16; an fp8 pool for ``fp8``), run the kernel, judge it."""
    from kdtree_verify import verify_attention
    from kdtree_verify.testing import assert_matches_reference, make_case

    options: dict[str, Any] = {}
    if case.fp8:
        # Scales unlike 1 and unlike each other, so a dropped or swapped scale fails.
        options = {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.25}
    started = time.perf_counter()
    try:
        built = make_case(
            list(case.prefix_lens),
            case.num_draft,
            case.num_heads,
            mask=case.mask,
            dtype=torch.bfloat16,
            device=device,
            seed=seed,
            **options,
        )
        out, lse = verify_attention(*built.args(), return_lse=True, **built.scales())
        torch.cuda.synchronize(device)
        assert_matches_reference(out, lse, built.args(), case.name, **built.scales())
        passed, detail = True, "within the bf16 bound of the float32 reference"
    except Exception as error:  # a failing case is reported, and the next one still runs
        passed, detail = False, f"{type(error).__name__}: {error}".splitlines()[0]
    return {
        "name": case.name,
        "prefix_lens": list(case.prefix_lens),
        "num_draft": case.num_draft,
        "num_heads": case.num_heads,
        "mask": case.mask,
        "kv": "fp8_e4m3" if case.fp8 else "bf16",
        "passed": passed,
        "detail": detail,
        "seconds": round(time.perf_counter() - started, 3),
    }


def triton_unavailable_reason() -> str | None:
    """Why SGLang's Triton verify path cannot be timed here, or None."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: F401
    except Exception as error:  # ImportError, or a Triton that cannot initialise
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def bench_shape(
    shape: BenchShape, device: torch.device, warmup: int, repeats: int, with_triton: bool
) -> dict[str, Any]:
    from kdtree_verify import verify_attention
    from kdtree_verify.testing import make_case, sglang_extend_attention

    case = make_case(
        [shape.prefix] * shape.batch,
        shape.draft,
        shape.heads,
        dtype=torch.bfloat16,
        device=device,
        seed=1,
    )
    args = case.args()
    record: dict[str, Any] = {"shape": shape.name, **shape.__dict__}
    record["kdtree"] = time_cuda(lambda: verify_attention(*args), warmup, repeats)
    if with_triton:
        record["triton"] = time_cuda(
            lambda: sglang_extend_attention(*args, max_draft_tokens=shape.draft), warmup, repeats
        )
        record["speedup"] = record["triton"]["median_us"] / record["kdtree"]["median_us"]
    return record


def device_facts(device: torch.device) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(device)
    major, minor = torch.cuda.get_device_capability(device)
    return {
        "name": props.name,
        "sm": f"sm_{major}{minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "torch_cuda": torch.version.cuda,
    }


def environment_facts() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sglang": installed("sglang"),
        "kdtree_verify": installed("kdtree-verify"),
        "triton": installed("triton"),
    }


# ------------------------------------------------------------------------------------ reports
def render_markdown(report: dict[str, Any]) -> str:
    device = report["device"]
    cases = report["cases"]
    passed = sum(c["passed"] for c in cases)
    lines = [
        f"# kdtree self-check: {'PASS' if report['passed'] else 'FAIL'}",
        "",
        f"Device: {device['name']} ({device['sm']}, {device['memory_gib']} GiB, "
        f"{device['multiprocessors']} SMs); torch {report['environment']['torch']}, "
        f"sglang {report['environment']['sglang']}; {report['time']}",
        "",
        f"## Correctness: {passed}/{len(cases)} cases pass",
        "",
        "| case | prefixes | draft | heads | mask | KV | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        prefixes = ", ".join(map(str, c["prefix_lens"][:4])) + (
            f", ... ({len(c['prefix_lens'])} requests)" if len(c["prefix_lens"]) > 4 else ""
        )
        result = "pass" if c["passed"] else f"FAIL: {c['detail']}"
        lines.append(
            f"| {c['name']} | {prefixes} | {c['num_draft']} | {c['num_heads']} | {c['mask']} "
            f"| {c['kv']} | {result} |"
        )
    bench = report["benchmark"]
    lines += [
        "",
        f"## Benchmark (bf16, tree mask; CUDA events, {bench['warmup']} warm-up calls, "
        f"{bench['repeats']} timed; median, [min, max], IQR in us)",
        "",
    ]
    if bench.get("triton_unavailable"):
        lines += [f"SGLang's Triton path not timed: {bench['triton_unavailable']}", ""]
    lines += [
        "| shape | kdtree | SGLang Triton | speedup |",
        "|---|---|---|---|",
    ]

    def cell(t: dict[str, float] | None) -> str:
        if not t:
            return "-"
        return f"{t['median_us']:.1f} [{t['min_us']:.1f}, {t['max_us']:.1f}], IQR {t['iqr_us']:.1f}"

    for r in bench["shapes"]:
        speedup = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        lines.append(
            f"| {r['shape']} | {cell(r['kdtree'])} | {cell(r.get('triton'))} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def write_reports(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """selfcheck.json and selfcheck.md in ``out_dir`` (created); each written whole, then renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (out_dir / "selfcheck.json", out_dir / "selfcheck.md")
    texts = (json.dumps(report, indent=2, sort_keys=True) + "\n", render_markdown(report))
    for path, text in zip(paths, texts, strict=True):
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text)
        partial.replace(path)
    return paths


# ------------------------------------------------------------------------------------ the CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdtree-selfcheck",
        description="Run the kdtree kernel's correctness cases and a short benchmark against "
        "SGLang's Triton path on this machine's GPU; write selfcheck.json and selfcheck.md.",
    )
    add_version_flag(parser)
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="report directory")
    parser.add_argument("--warmup", type=_positive, default=10, help="untimed calls per shape")
    parser.add_argument("--repeats", type=_positive, default=50, help="timed calls per shape")
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK_SHAPES)} shapes only")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _refuse(message: str) -> int:
    print(f"kdtree-selfcheck: {message}", file=sys.stderr, flush=True)
    return ExitCode.REFUSED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        return _refuse(
            "refused: no CUDA device is visible (torch.cuda.is_available() is False); run it on "
            "a GPU host, e.g. docker run --gpus all kdtree/inference:TAG kdtree-selfcheck"
        )
    if args.device >= torch.cuda.device_count():
        return _refuse(
            f"refused: --device {args.device}, but {torch.cuda.device_count()} device(s) are visible"
        )
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    cases = [run_case(case, device) for case in CASES]
    unavailable = triton_unavailable_reason()
    shapes = QUICK_SHAPES if args.quick else BENCH_SHAPES
    passed = all(c["passed"] for c in cases)
    records = (
        [bench_shape(s, device, args.warmup, args.repeats, unavailable is None) for s in shapes]
        if passed  # timing a kernel that computes the wrong thing measures nothing
        else []
    )
    report = {
        "schema": SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "passed": passed,
        "device": device_facts(device),
        "environment": environment_facts(),
        "cases": cases,
        "benchmark": {
            "warmup": args.warmup,
            "repeats": args.repeats,
            "triton_unavailable": unavailable,
            "skipped": None if passed else "a correctness case failed",
            "shapes": records,
        },
    }
    json_path, md_path = write_reports(report, args.out)
    print(md_path.read_text(), end="")
    print(f"kdtree-selfcheck: wrote {json_path} and {md_path}", file=sys.stderr)
    return ExitCode.OK if passed else ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
