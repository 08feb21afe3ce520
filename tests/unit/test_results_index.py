"""bench/results/INDEX.md is what kdtree_bench.analysis.results_index generates from the records,
and the generator reads each kind of record, its run and the documents that cite it."""

from __future__ import annotations

import json
from pathlib import Path

from kdtree_bench.analysis import results_index


def test_the_committed_index_is_a_fresh_generation() -> None:
    committed = (results_index.RESULTS / results_index.INDEX).read_text()
    assert committed == results_index.render(), (
        "bench/results/INDEX.md is stale: run python -m kdtree_bench.analysis.results_index"
    )


def test_every_record_is_in_the_index_and_every_run_folder_has_its_journal_row() -> None:
    index = (results_index.RESULTS / results_index.INDEX).read_text()
    for record in results_index.records(results_index.RESULTS):
        assert f"## `{record}`" in index
    runs = results_index.journal_runs(results_index.REPO)
    for folder in results_index.RESULTS.glob("gpu_run*"):
        assert folder.name in runs, folder.name


def test_a_record_is_described_cited_and_dated_from_what_is_there(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    (results / "sglang_e2e" / "run7").mkdir(parents=True)
    (results / "sglang_e2e" / "run7" / "speed.log").write_text("")
    (results / "gpu_run9_x").mkdir()
    (results / "gpu_run9_x" / "command.sh").write_text("")
    bench = {"device": "GPU", "timing": {}, "records": [{}, {}], "complete": True}
    (results / "h200.json").write_text(json.dumps(bench))
    merged = {"device": "GPU, 0 MiB", "records": [{"log": "run7/speed.log"}], "runs": {"run7": {}}}
    (results / "e2e.json").write_text(json.dumps(merged))
    (results / "README.md").write_text("hand-written")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "kernel-journal.md").write_text(
        "| 9 | **in tree** `gpu_run9_x` | a run | 1.0x | `abc1234` |\n"
        "| e2e 7 | **in tree** `sglang_e2e/run7` | speed | 2x | `def5678` |\n"
    )
    (tmp_path / "docs" / "kernel.md").write_text(
        "`bench/results/h200.json`, e2e 7; not h200_old.json"
    )
    (tmp_path / "README.md").write_text("`gpu_run9_x/command.sh`")
    text = results_index.render(results, tmp_path)
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## `e2e.json`",
        "## `gpu_run9_x`",
        "## `h200.json`",
        "## `sglang_e2e/run7`",
    ]
    assert "- measured: kernel benchmark: 2 shapes (complete) on GPU" in text
    assert "- measured: real SGLang servers' decode speed: 1 rows from run7 on GPU" in text
    assert "- run: 9 in docs/kernel-journal.md, commit `abc1234`" in text
    assert "- run: e2e 7 in docs/kernel-journal.md, commit `def5678`" in text
    assert "- its files are named by: e2e.json" in text
    sections = dict(s.split("\n", 1) for s in text.split("\n\n## ")[1:])
    assert sections["`h200.json`"].endswith("cited by: docs/kernel.md")
    assert "cited by: docs/kernel.md" in sections["`sglang_e2e/run7`"]
    assert "cited by: README.md" in sections["`gpu_run9_x`"]
    assert sections["`e2e.json`"].endswith("cited by: no current document")
