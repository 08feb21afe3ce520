"""``make demo``: a baseline and a candidate engine on loopback, one corpus, token-by-token.

Starts two real servers: the baseline with ``KDTREE_VERIFY=off`` (plain torch reference on CPU,
SGLang's Triton kernel on GPU) and the candidate with ``KDTREE_VERIFY=on`` (kdtree's verify op:
its CPU implementation, or the CUDA kernel on GPU). Runs the corpus through both, greedy, and
prints the comparison. The servers are always stopped, on success, failure or Ctrl-C.

Steps are separate functions: ``start_pair`` -> ``collect`` -> ``compare`` -> ``print_report``;
``compare`` is the step the parity sidecar replaces.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .corpus import prompts
from .launch import EngineProcess


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


def _post(url: str, body: dict, timeout: float = 300.0) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def start_pair(log_dir: Path, candidate_options: dict) -> tuple[EngineProcess, EngineProcess]:
    baseline = EngineProcess(log_dir / "baseline.log", env={"KDTREE_VERIFY": "off"})
    candidate = EngineProcess(
        log_dir / "candidate.log", env={"KDTREE_VERIFY": "on"}, **candidate_options
    )
    return baseline, candidate


def collect(server: EngineProcess, corpus: list[str], max_new_tokens: int) -> list[dict]:
    """Greedy outputs for the corpus, one batched /generate call (the engine batches them)."""
    body = {"text": corpus, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}}
    return _post(server.url + "/generate", body)


def compare(corpus: list[str], base: list[dict], cand: list[dict]) -> list[PromptComparison]:
    return [
        PromptComparison(p, b["output_ids"], c["output_ids"], b["text"], c["text"])
        for p, b, c in zip(corpus, base, cand, strict=True)
    ]


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
    p.add_argument("--candidate-fault-layer", type=int, default=None,
                   help="make the candidate deliberately wrong (shows what a difference looks like)")  # fmt: skip
    p.add_argument("--candidate-fault-scale", type=float, default=1.5)
    p.add_argument("--strict", action="store_true", help="exit 1 if any prompt differs")
    args = p.parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kdtree-demo-"))
    candidate_options = {}
    if args.candidate_fault_layer is not None:
        candidate_options = {"fault_layer": args.candidate_fault_layer,
                             "fault_scale": args.candidate_fault_scale}  # fmt: skip
    # SIGTERM (e.g. from make or CI) unwinds like Ctrl-C so the finally below stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    servers: list[EngineProcess] = []
    try:
        servers = list(start_pair(log_dir, candidate_options))
        print(f"starting baseline and candidate servers (logs in {log_dir}) ...", flush=True)
        for server in servers:
            server.wait(timeout=300)
        baseline, candidate = servers
        print(f"servers ready: baseline {baseline.url}, candidate {candidate.url}", flush=True)
        info = {"baseline": _backend_info(baseline), "candidate": _backend_info(candidate)}
        corpus = prompts(args.prompts)
        start = time.perf_counter()
        base_out = collect(baseline, corpus, args.max_new_tokens)
        cand_out = collect(candidate, corpus, args.max_new_tokens)
        rows = compare(corpus, base_out, cand_out)
        print_report(rows, info)
        print(f"({len(corpus)} prompts x 2 servers in {time.perf_counter() - start:.1f}s)")
        differs = any(r.first_divergence is not None for r in rows)
        return 1 if args.strict and differs else 0
    except KeyboardInterrupt:
        print("\ninterrupted; stopping servers", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
