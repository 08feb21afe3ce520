"""``make demo``: a baseline and a candidate engine on loopback, one corpus, token-by-token.

Starts two real servers: the baseline with ``KDTREE_VERIFY=off`` (plain torch reference on CPU,
SGLang's Triton kernel on GPU) and the candidate with ``KDTREE_VERIFY=on`` (kdtree's verify op:
its CPU implementation, or the CUDA kernel on GPU). Runs the corpus through both, greedy, and
prints the comparison. The servers are always stopped, on success, failure or Ctrl-C.

Steps are separate functions: ``start_pair`` -> ``compare_with_sidecar`` (the parity sidecar,
``kdtree-parity run``, which writes the report under ``runs/demo``) -> ``print_report``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..exit_codes import ExitCode
from .corpus import prompts
from .launch import EngineProcess, interrupts_deferred, stop_process


@dataclass
class PromptComparison:
    prompt: str
    baseline_ids: list[int]
    candidate_ids: list[int]
    baseline_text: str
    candidate_text: str

    @property
    def first_divergence(self) -> int | None:
        """Index of the first differing token, or None if the sequences are identical."""
        for i, (a, b) in enumerate(zip(self.baseline_ids, self.candidate_ids, strict=False)):
            if a != b:
                return i
        if len(self.baseline_ids) != len(self.candidate_ids):
            return min(len(self.baseline_ids), len(self.candidate_ids))
        return None


def start_pair(
    log_dir: Path, device: str | None, candidate_options: dict
) -> tuple[EngineProcess, EngineProcess]:
    baseline = EngineProcess(log_dir / "baseline.log", env={"KDTREE_VERIFY": "off"}, device=device)
    candidate = EngineProcess(
        log_dir / "candidate.log", env={"KDTREE_VERIFY": "on"}, device=device, **candidate_options
    )
    return baseline, candidate


# The parity sidecar, a separate program: this package runs it and never imports it.
SIDECAR = [sys.executable, "-m", "kdtree_parity.cli"]


def demo_policy(overrides: dict[str, dict[str, int]]) -> str:
    """The shipped "short" policy as YAML, with ``overrides`` ({section: {key: value}}) applied.

    "short" suits the demo (float32 on CPU: identical servers match exactly, A/A drift is 0);
    only its generation length and prompt count are sized to the demo's corpus. The sidecar
    prints it with every key (``kdtree-parity policy --show short``: sections at the margin,
    their keys indented by two spaces); each override replaces one key's line, and one that
    matches no key is refused. The sidecar loads the result strictly, as any policy file.
    """
    shown = subprocess.run(
        [*SIDECAR, "policy", "--show", "short"], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        raise RuntimeError(f"kdtree-parity policy --show short failed: {shown.stderr.strip()}")
    pending = {(s, key): value for s, keys in overrides.items() for key, value in keys.items()}
    lines, section = ["# kdtree parity policy of make demo: short, sized to the demo corpus"], None
    for line in shown.stdout.splitlines():
        if line.startswith("#"):
            continue
        if not line.startswith(" "):
            section = line.rstrip(":")
        else:
            key = line.strip().split(":", 1)[0]
            if (section, key) in pending:
                line = f"  {key}: {json.dumps(pending.pop((section, key)))}"
        lines.append(line)
    if pending:
        raise RuntimeError(f"the short policy has no keys {sorted(pending)}")
    return "\n".join(lines) + "\n"


def compare_with_sidecar(
    baseline: EngineProcess,
    candidate: EngineProcess,
    corpus: list[str],
    max_new_tokens: int,
    out_dir: Path = Path("runs/demo"),
) -> tuple[list[PromptComparison], Path | None, int]:
    """The comparison step, done by the parity sidecar.

    ``kdtree-parity run`` replays the corpus greedily against both servers (and the baseline a
    second time, for A/A noise), compares them token by token, decides by a policy and writes
    its report to ``out_dir/<run id>/report.{html,json,md}``. The rows printed by the demo are
    read back from that report. Returns (rows, report.html or None, the sidecar's exit code:
    0 pass, 1 fail, 2 could not decide).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus_path = out_dir / "corpus.jsonl"
    corpus_path.write_text(
        "".join(json.dumps({"id": f"demo-{i:03d}", "text": p}) + "\n" for i, p in enumerate(corpus))
    )
    policy_path = out_dir / "policy.yaml"
    policy_path.write_text(
        demo_policy(
            {"replay": {"max_new_tokens": max_new_tokens}, "gate": {"min_prompts": len(corpus)}}
        )
    )
    before = set(out_dir.glob("*/report.json"))
    sidecar = None
    try:
        with interrupts_deferred():  # Ctrl-C while it starts must not orphan the sidecar
            sidecar = subprocess.Popen(
                [
                    *SIDECAR,
                    "run",
                    "--baseline",
                    baseline.url,
                    "--candidate",
                    candidate.url,
                    "--corpus",
                    str(corpus_path),
                    "--policy",
                    str(policy_path),
                    "--out",
                    str(out_dir),
                    "--db",
                    str(out_dir / "parity.sqlite3"),
                ],
            )
        returncode = sidecar.wait()
    finally:
        if sidecar is not None:
            stop_process(sidecar)
    new = sorted(set(out_dir.glob("*/report.json")) - before)
    if len(new) != 1:
        return [], None, returncode
    report = json.loads(new[0].read_text())
    rows = []
    for prompt in report["prompts"]:
        sides = {side["role"]: side for side in prompt["sides"]}
        base, cand = sides["baseline"], sides["candidate"]
        rows.append(
            PromptComparison(
                prompt["prompt"], base["output_ids"], cand["output_ids"], base["text"], cand["text"]
            )
        )
    return rows, new[0].with_name("report.html"), returncode


def print_report(rows: list[PromptComparison], info: dict[str, dict]) -> None:
    print(f"\nbaseline : {info['baseline']}\ncandidate: {info['candidate']}\n")
    for i, row in enumerate(rows):
        where = row.first_divergence
        verdict = "identical" if where is None else f"DIFFERS at token {where}"
        print(
            f"[{i:2d}] {verdict:22s} {len(row.baseline_ids):3d} tokens  prompt={row.prompt[:40]!r}"
        )
        if where is not None:
            print(f"     baseline : {row.baseline_ids[where : where + 8]} {row.baseline_text!r}")
            print(f"     candidate: {row.candidate_ids[where : where + 8]} {row.candidate_text!r}")
    same = sum(r.first_divergence is None for r in rows)
    print(f"\n{same}/{len(rows)} prompts token-for-token identical")


def _backend_info(server: EngineProcess) -> dict:
    with urllib.request.urlopen(server.url + "/model_info", timeout=10) as resp:
        engine = json.loads(resp.read())["kdtree_engine"]
    return {k: engine[k] for k in ("attention_backend", "device", "dtype", "fault_layer")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="baseline vs candidate engine, token by token")
    p.add_argument("--prompts", type=int, default=12, help="corpus size")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--log-dir", default=None, help="server logs (default: a temporary directory)")
    p.add_argument(
        "--candidate-fault-layer",
        type=int,
        default=None,
        help="make the candidate deliberately wrong (shows what a difference looks like)",
    )
    p.add_argument("--candidate-fault-scale", type=float, default=1.5)
    p.add_argument("--strict", action="store_true", help="exit 1 if any prompt differs")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    args = p.parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kdtree-demo-"))
    candidate_options = {}
    if args.candidate_fault_layer is not None:
        candidate_options = {
            "fault_layer": args.candidate_fault_layer,
            "fault_scale": args.candidate_fault_scale,
        }
    # SIGTERM (e.g. from make or CI) unwinds like Ctrl-C so the finally below stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    servers: list[EngineProcess] = []
    try:
        with interrupts_deferred():  # Ctrl-C while they start must not orphan a server
            servers = list(start_pair(log_dir, args.device, candidate_options))
        print(f"starting baseline and candidate servers (logs in {log_dir}) ...", flush=True)
        for server in servers:
            server.wait(timeout=300)
        baseline, candidate = servers
        print(f"servers ready: baseline {baseline.url}, candidate {candidate.url}", flush=True)
        info = {"baseline": _backend_info(baseline), "candidate": _backend_info(candidate)}
        corpus = prompts(args.prompts)
        start = time.perf_counter()
        rows, report_html, verdict_code = compare_with_sidecar(
            baseline, candidate, corpus, args.max_new_tokens
        )
        print_report(rows, info)
        # kdtree-parity's own exit statuses (kdtree_parity.exit_codes: 0 passed, 1 failed).
        verdict = {0: "PASS", 1: "FAIL"}.get(verdict_code, "COULD NOT DECIDE")
        print(f"parity verdict: {verdict}; report: {report_html or 'none written'}")
        print(
            f"({len(corpus)} prompts, baseline twice + candidate, in "
            f"{time.perf_counter() - start:.1f}s)"
        )
        differs = not rows or any(r.first_divergence is not None for r in rows)
        return ExitCode.FAILED if args.strict and differs else ExitCode.OK
    except KeyboardInterrupt:
        print("\ninterrupted; stopping servers", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
