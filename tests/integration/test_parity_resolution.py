"""The gate's resolution on real reference engines: a small grid of bench/kdtree_bench/e2e/parity_resolution.py
(12 prompts, the shipped short policy, the split-KV floor the committed table was measured
against) against the committed table. The identical, the equivalent-numerics (KDTREE_VERIFY=on)
and the floor's own configuration as candidates pass; every fault kind at the smallest size the
committed table says this corpus detects fails; every verdict and failing rule equals the
committed cell (the engine is float32 and batch-invariant, so the table is deterministic); a
report given the table prints that resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parity_support import run_cli

from kdtree_bench.e2e import parity_resolution

ROOT = Path(__file__).resolve().parents[2]

COMMITTED = ROOT / "bench" / "results" / "parity_resolution" / "resolution.json"
PROMPTS = 12

pytestmark = pytest.mark.slow


def at_resolution(table: dict) -> list[str]:
    """Per fault kind, the smallest fault the committed table says 12 prompts detect."""
    faults = []
    for kind, per_size in table["resolution"].items():
        size = per_size[str(PROMPTS)]["smallest_detected"]
        assert size is not None, f"the committed table detects no {kind} fault at {PROMPTS}"
        [name] = {c["candidate"] for c in table["cells"] if c["kind"] == kind and c["size"] == size}
        faults.append(name)
    return faults


def test_small_grid_matches_the_committed_table(tmp_path):
    committed = json.loads(COMMITTED.read_text())
    assert PROMPTS in committed["corpus_sizes"] and committed["policy"]["min_prompts"] == PROMPTS
    faults = at_resolution(committed)
    assert {f.split(":")[0] for f in faults} == {
        "scale",
        "weight",
        "kv_drop",
        "tree_mask",
        "layer_scale",
    }
    assert committed["floor"] == "baseline with --attention-kv-splits 3"
    table = parity_resolution.measure(
        faults,
        [PROMPTS],
        tmp_path / "res",
        "short",
        log=lambda _: None,
        pack_raw=False,
        floor=parity_resolution.kv_splits_floor(3),
    )
    cells = {c["candidate"]: c for c in table["cells"]}
    assert cells["identical"]["verdict"] == "pass"
    assert cells["identical"]["figures"]["drift_max"] == 0.0
    assert cells["equivalent_numerics"]["verdict"] == "pass"
    assert cells["equivalent_numerics"]["figures"]["drift_max"] > 0  # other numerics, really
    assert cells["kv_splits_3"]["verdict"] == "pass"
    for fault in faults:
        assert cells[fault]["verdict"] == "fail", (fault, cells[fault])
    expected = {(c["candidate"], c["prompts"]): c for c in committed["cells"]}
    for name, cell in cells.items():
        mine = expected[(name, PROMPTS)]
        assert (cell["verdict"], cell["failed_rules"]) == (mine["verdict"], mine["failed_rules"])

    # A report given the committed table names the smallest fault of each kind it detects.
    raw = tmp_path / "res" / "raw"
    [report] = (raw / "runs" / "identical_12").glob("*/report.json")
    run_id = json.loads(report.read_text())["run"]["id"]
    shown = run_cli(
        "report", run_id, "--db", raw / "runs.sqlite3", "--format", "md", "--resolution", COMMITTED
    )
    assert shown.returncode == 0, shown.stderr
    assert "## Resolution (smallest fault detected)" in shown.stdout
    assert "the 12-prompt row applies" in shown.stdout
    for kind, per_size in committed["resolution"].items():
        size = per_size[str(PROMPTS)]["smallest_detected"]
        shown_size = f"{int(size)}" if kind in ("kv_drop", "tree_mask") else f"{size:g}"
        name = kind.replace("_", "\\_")  # Markdown-escaped
        assert f"| {name} | {name}:{shown_size} |" in shown.stdout
