"""The gate against an A/A' noise floor and its speed rule, between real reference-engine servers.

The floor is the baseline's model served with ``--attention-kv-splits 3`` (split-KV attention:
equivalent numerics, not bit-identical). Judged against it with the shipped ``short`` policy:
the verify op (KDTREE_VERIFY=on) and the floor's own computation pass, a 0.1% perturbation of a
layer fails on drift, and a candidate slowed on purpose (``--decode-step-delay``) fails on the
speed rule alone. Each report prints every test's statistic, p-value and decision.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from parity_support import only_report, run_gate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(reference_server_module) -> dict[str, str]:
    start = reference_server_module
    return {
        "baseline": start(),
        "floor": start(attention_kv_splits=3),
        "op": start(env={"KDTREE_VERIFY": "on"}),
        "perturbed": start(fault_layer=1, fault_scale=1.001),
        "slow": start(decode_step_delay=1.0),
    }


def _gate(servers: dict[str, str], candidate: str, out: Path, *extra: str):
    done = run_gate(
        servers["baseline"],
        servers[candidate],
        "short",
        "short",
        out,
        out.parent / "runs.sqlite3",
        "--floor",
        servers["floor"],
        *extra,
    )
    report = only_report(out)
    failing = [r["rule"] for r in report["verdict"]["reasons"] if r["outcome"] != "pass"]
    return done, report, failing


def test_equivalent_candidates_pass_against_the_floor(servers, tmp_path: Path) -> None:
    for name in ("op", "floor"):
        done, report, failing = _gate(servers, name, tmp_path / name)
        why = (report["verdict"]["reasons"], done.stderr[-2000:])
        assert (done.returncode, failing) == (0, []), why
        s = report["summary"]
        # The floor has noise in it (not an exact twin), and the exact twin none.
        assert s["floor"]["drift"]["max"] > 0 and s["aa"]["drift"]["max"] == 0.0, why
        assert s["floor"]["hard"] == 0
        tests = {r["test"]["name"]: r["test"] for r in report["verdict"]["reasons"] if r["test"]}
        assert set(tests) == {"logprob_drift", "divergence_count", "decode_speed"}
        assert tests["logprob_drift"]["p_value"] is not None
        assert tests["logprob_drift"]["alpha"] == pytest.approx(0.05 / 3)
        assert all(t["decision"] == "pass" for t in tests.values()), tests
        low, high = tests["decode_speed"]["interval"]
        assert low <= tests["decode_speed"]["estimate"] <= high
        roles = {sp["role"]: sp for sp in s["speed"]}
        assert set(roles) == {"baseline", "candidate", "aa", "floor"}
        assert all(sp["median_decode_tps"] > 0 and sp["median_ttft_s"] > 0 for sp in roles.values())
    targets = {t["role"]: t["url"] for t in report["targets"]}
    assert targets["floor"] == servers["floor"]
    run_dir = next((tmp_path / "floor").iterdir())
    markdown = (run_dir / "report.md").read_text()
    assert "Mann-Whitney" in markdown and "Fisher" in markdown and "A/A' noise floor" in markdown
    assert "median decode tokens/s" in markdown
    html = (run_dir / "report.html").read_text()
    assert 'id="tests"' in html and 'id="floor"' in html and 'id="speed"' in html


def test_a_perturbed_layer_fails_on_drift_over_the_floor(servers, tmp_path: Path) -> None:
    done, report, failing = _gate(servers, "perturbed", tmp_path / "perturbed")
    assert (done.returncode, failing) == (1, ["logprob_drift_p99"]), report["verdict"]["reasons"]
    drift = next(
        r["test"] for r in report["verdict"]["reasons"] if r["rule"] == "logprob_drift_p99"
    )
    assert drift["decision"] == "fail" and drift["p_value"] < drift["alpha"]


def test_a_slow_candidate_is_refused_by_the_speed_rule(servers, tmp_path: Path) -> None:
    done, report, failing = _gate(servers, "slow", tmp_path / "slow")
    speed = next(r for r in report["verdict"]["reasons"] if r["rule"] == "speed")
    assert (done.returncode, failing) == (1, ["speed"]), report["verdict"]["reasons"]
    assert speed["test"]["interval"][1] < 0.25, speed  # the short policy's max_slowdown 0.75
    assert "ratio" in speed["message"] and "FAIL speed" in done.stdout.replace("[red]", "")
