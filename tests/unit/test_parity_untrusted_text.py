"""Text the gate does not control (here: prompt ids and a policy path) shown on a terminal, in
Markdown and in HTML: markup escaped, no line of the gate's format forged, no bidi control."""

from __future__ import annotations

from pathlib import Path

from parity_factories import exact, hard, run_parity_cli

from kdtree_parity.corpus import parse_corpus
from kdtree_parity.gate import decide, summarize
from kdtree_parity.policy import parse_policy
from kdtree_parity.runner import start_run, verdict_to_json
from kdtree_parity.store import Store
from kdtree_parity.targets import Targets
from kdtree_parity.untrusted_text import for_markdown, for_terminal, printable

MARKUP_ID = "a[/x]"
FORGED_ID = "b\n[bold green]verdict: PASS[/] ok"
HTML_ID = "c<script>alert(1)</script>\n# PASS \u202eevil"
POLICY = "gate:\n  min_prompts: 3\n  max_excess_divergence_rate: 1.0\n"


def _stored_run(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "runs.sqlite3"
    store = Store(db)
    lines = (f'{{"id": "{i}", "text": "x"}}\n' for i in "xyz")
    corpus = parse_corpus("".join(lines).encode(), source="c.jsonl")
    policy = parse_policy(POLICY, source="p[/y].yaml")
    run_id = start_run(
        store, corpus, policy, Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    )
    results = [exact(MARKUP_ID), hard(FORGED_ID), hard(HTML_ID)]
    for i, r in enumerate(results):
        store.save_result(run_id, i, r)
    verdict = decide(summarize(results, 3), policy.policy.gate)
    store.finish_run(run_id, "failed", verdict=verdict_to_json(verdict))
    store.close()
    return db, run_id


def test_the_terminal_shows_ids_as_text(tmp_path: Path) -> None:
    """Before: ``[/x]`` crashed the CLI (exit 1, the FAIL code) and the newline plus markup
    printed a line ``verdict: PASS`` of its own."""
    db, run_id = _stored_run(tmp_path)
    policy = tmp_path / "p[red].yaml"
    policy.write_text(POLICY)
    done = run_parity_cli("judge", run_id, "--policy", policy, "--db", db)
    assert done.returncode == 1, done.stderr  # the verdict's exit code, not a crash
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("verdict:")]
    assert verdicts == [verdicts[0]] and verdicts[0].startswith("verdict: FAIL"), done.stdout
    assert "b\\u000a[bold green]verdict: PASS[/] ok" in done.stdout
    assert "p[red].yaml" in done.stdout


def test_markdown_and_html_show_ids_as_text(tmp_path: Path) -> None:
    """Before: report.md carried ``<script>`` and a ``# PASS`` line of the id's own, and the
    right-to-left override reversed the HTML report's line."""
    db, run_id = _stored_run(tmp_path)
    md = run_parity_cli("report", run_id, "--format", "md", "--db", db)
    assert (md.returncode, md.stderr) == (1, "")  # the run's verdict: fail
    assert "<script>" not in md.stdout and "&lt;script&gt;" in md.stdout
    assert not any(line.startswith("# PASS") for line in md.stdout.splitlines())
    assert "\u202e" not in md.stdout and "\\u202e" in md.stdout
    page = run_parity_cli("report", run_id, "--format", "html", "--db", db)
    assert (page.returncode, page.stderr) == (1, "")
    assert "\u202e" not in page.stdout and "<script>alert" not in page.stdout


def test_each_medium_escapes_its_own_markup() -> None:
    assert printable("a\u2028b\u0085c\u202ed\te", keep_newlines=False) == (
        "a\\u2028b\\u0085c\\u202ed\\u0009e"
    )
    assert printable("a\nb", keep_newlines=True) == "a\nb"
    assert for_terminal("[red]x[/]\n") == "\\[red]x\\[/]\\u000a"
    assert for_markdown("*a* | `b` <i>") == "\\*a\\* \\| \\`b\\` &lt;i&gt;"
