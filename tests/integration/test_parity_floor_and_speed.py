"""The gate against an A/A' noise floor and its speed rule, between real reference-engine servers.

The floor is the baseline's model served with ``--attention-kv-splits 3`` (split-KV attention:
equivalent numerics, not bit-identical). Judged against it with the shipped ``short`` policy:
the verify op (KDTREE_VERIFY=on) and the floor's computation in a process of its own pass; a
0.1% perturbation of a layer and a KV row dropped on the verify op (a fault at a minority of
positions, which a floor with noise once hid) fail on drift; a candidate slowed on purpose
(``--decode-step-delay``) fails on the speed rule alone, whatever it reports about its speed and
however slow the twin is. Reference targets that cannot be trusted (the candidate behind another
URL, a floor that diverges hard) leave the run undecided. Each report prints every test's
statistic, interval or p-value, decision and power.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from parity_proxy import ForwardingProxy
from parity_support import only_report, run_gate, write_inputs

from kdtree_parity.runner import identity_differences

pytestmark = pytest.mark.slow
DRIFT_RULES = {"logprob_drift_p99", "logprob_drift_tail", "logprob_drift_prompt_max"}


@pytest.fixture(scope="module")
def servers(reference_server_module) -> dict[str, str]:
    start = reference_server_module
    return {
        "baseline": start(),
        "floor": start(attention_kv_splits=3),
        "floor_again": start(attention_kv_splits=3),  # the floor's numerics, another process
        "op": start(env={"KDTREE_VERIFY": "on"}),
        "perturbed": start(fault_layer=1, fault_scale=1.001),
        "kv_drop": start(env={"KDTREE_VERIFY": "on", "KDTREE_INJECT_FAULT": "kv_drop:32"}),
        "slow": start(decode_step_delay=0.3),
        "slow_again": start(decode_step_delay=0.3),  # a slow twin in a process of its own
    }


def _gate(
    servers: dict[str, str], candidate: str, out: Path, *extra: str, floor: str | None = None
):
    done = run_gate(
        servers["baseline"],
        servers.get(candidate, candidate),
        "short",
        "short",
        out,
        out.parent / "runs.sqlite3",
        "--floor",
        floor or servers["floor"],
        *extra,
    )
    report = only_report(out)
    failing = [r["rule"] for r in report["verdict"]["reasons"] if r["outcome"] != "pass"]
    return done, report, failing


def test_equivalent_candidates_pass_against_the_floor(servers, tmp_path: Path) -> None:
    for name in ("op", "floor_again"):
        done, report, failing = _gate(servers, name, tmp_path / name)
        why = (report["verdict"]["reasons"], done.stderr[-2000:])
        assert (done.returncode, failing) == (0, []), why
        s = report["summary"]
        # The floor has noise in it (not an exact twin), and the exact twin none.
        assert s["floor"]["drift"]["max"] > 0 and s["aa"]["drift"]["max"] == 0.0, why
        assert s["floor"]["hard"] == 0
        tests = {r["test"]["name"]: r["test"] for r in report["verdict"]["reasons"] if r["test"]}
        assert set(tests) == {
            "logprob_drift",
            "drift_exceedances",
            "drift_prompt_maxima",
            "divergence_count",
            "decode_speed",
        }
        high = tests["logprob_drift"]["interval"][1]
        assert high <= 0.0005, tests  # the p99 excess shown within the short policy's margin
        assert tests["logprob_drift"]["alpha"] == pytest.approx(0.05 / 5)
        assert all(t["decision"] == "pass" and t["power"] for t in tests.values()), tests
        low, high = tests["decode_speed"]["interval"]
        assert low <= tests["decode_speed"]["estimate"] <= high
        roles = {sp["role"]: sp for sp in s["speed"]}
        assert set(roles) == {"baseline", "candidate", "aa", "floor"}
        assert all(sp["median_decode_tps"] > 0 and sp["median_ttft_s"] > 0 for sp in roles.values())
    targets = {t["role"]: t["url"] for t in report["targets"]}
    assert targets["floor"] == servers["floor"]
    run_dir = next((tmp_path / "floor_again").iterdir())
    markdown = (run_dir / "report.md").read_text()
    assert "bootstrap" in markdown and "binomial" in markdown and "A/A' noise floor" in markdown
    assert "tokens/s (sidecar's clock)" in markdown and "power" in markdown
    html = (run_dir / "report.html").read_text()
    assert 'id="tests"' in html and 'id="floor"' in html and 'id="speed"' in html


def test_a_perturbed_layer_fails_on_drift_over_the_floor(servers, tmp_path: Path) -> None:
    done, report, failing = _gate(servers, "perturbed", tmp_path / "perturbed")
    assert done.returncode == 1 and set(failing) <= DRIFT_RULES, report["verdict"]["reasons"]
    drift = next(
        r["test"] for r in report["verdict"]["reasons"] if r["rule"] == "logprob_drift_p99"
    )
    assert drift["decision"] == "fail" and drift["interval"][0] > 0.0005


def test_a_kv_row_dropped_on_the_verify_op_fails_against_the_floor(servers, tmp_path: Path) -> None:
    """Before: the same candidate FAILED without a floor and PASSED against this one: most
    positions sit at the floor's noise, so a Mann-Whitney test over all positions was not
    significant however large the tail."""
    done, report, _ = _gate(servers, "kv_drop", tmp_path / "kv_drop")
    reasons = {r["rule"]: r for r in report["verdict"]["reasons"]}
    assert done.returncode == 1, report["verdict"]["reasons"]
    assert reasons["logprob_drift_tail"]["outcome"] == "fail", reasons["logprob_drift_tail"]


def test_a_slow_candidate_is_refused_by_the_speed_rule(servers, tmp_path: Path) -> None:
    done, report, failing = _gate(servers, "slow", tmp_path / "slow")
    speed = next(r for r in report["verdict"]["reasons"] if r["rule"] == "speed")
    assert (done.returncode, failing) == (1, ["speed"]), report["verdict"]["reasons"]
    assert speed["test"]["interval"][1] < 0.25, speed  # the short policy's max_slowdown 0.75
    assert "ratio" in speed["message"] and "FAIL speed" in done.stdout.replace("[red]", "")


def _speed_gate(tmp_path: Path, baseline: str, candidate: str, *extra: str):
    """4 prompts of 8 tokens with the speed rule of the short policy (max_slowdown 0.75)."""
    tmp_path.mkdir()
    corpus, policy = write_inputs(tmp_path, 4, gate={"max_slowdown": 0.75})
    out = tmp_path / "out"
    done = run_gate(baseline, candidate, corpus, policy, out, tmp_path / "runs.sqlite3", *extra)
    report = only_report(out)
    return done, next(r for r in report["verdict"]["reasons"] if r["rule"] == "speed")


def _reported_speed(tps: float | None):
    """A proxy rewrite: the answer's self-reported speed set to ``tps`` (None: left out)."""

    def rewrite(answer: dict) -> None:
        meta = answer["meta_info"]
        for key in ("decode_throughput", "e2e_latency", "first_token_latency"):
            meta.pop(key, None)
        if tps is not None:
            meta["decode_throughput"] = tps

    return rewrite


def test_speed_is_the_sidecars_own_clock(servers, tmp_path: Path) -> None:
    """Before: the target's own ``decode_throughput`` decided. A slow candidate reporting 10,000
    tokens/s PASSED; an equally fast one whose answers lack timing fields FAILED; a twin as slow
    as the candidate scaled the limit so that the slow candidate PASSED."""
    boasting = ForwardingProxy(servers["slow"], rewrite=_reported_speed(10000.0))
    # Equally fast: two processes of one configuration behind a proxy each, one of them
    # dropping the timing fields (the same proxy cost on both sides).
    silent = ForwardingProxy(servers["floor_again"], rewrite=_reported_speed(None))
    plain = ForwardingProxy(servers["floor"])
    try:
        done, speed = _speed_gate(tmp_path / "boasting", servers["baseline"], boasting.url)
        assert (done.returncode, speed["outcome"]) == (1, "fail"), speed
        assert "self-reported decode 1e+04" in speed["message"] and "not used" in speed["message"]
        done, speed = _speed_gate(tmp_path / "silent", plain.url, silent.url)
        assert speed["outcome"] == "pass", (speed, done.stdout[-2000:])
        done, speed = _speed_gate(
            tmp_path / "slow_twin",
            servers["baseline"],
            boasting.url,
            "--replica",
            servers["slow_again"],
        )
        # The twin is trusted (another process, the baseline's numerics), so the speed rule
        # itself judges: the twin's slowness may leave it undecided, never passing.
        assert speed["test"] and speed["outcome"] != "pass" and done.returncode != 0, speed
    finally:
        for proxy in (boasting, silent, plain):
            proxy.close()


def _overlap(spans: list[tuple[float, float]]) -> bool:
    """Whether any two of these (start, end) spans are in flight at once."""
    busy_until = float("-inf")
    for start, end in sorted(spans):
        if start < busy_until:
            return True
        busy_until = max(busy_until, end)
    return False


def test_targets_in_turn_are_each_timed_alone(servers, tmp_path: Path) -> None:
    """Targets that share a GPU: asked at once, each one's rate is its share of the contended
    device (e2e 58). With ``replay.targets_in_turn`` no two requests of the run are ever in
    flight together; without it the targets' requests overlap (each first answer held 0.3 s)."""
    for in_turn in (False, True):
        run = tmp_path / f"in_turn_{in_turn}"
        run.mkdir()
        corpus, policy = write_inputs(run, 3, targets_in_turn=in_turn)
        proxies = [
            ForwardingProxy(servers[name], delay_s=0.3, slow_first=1)
            for name in ("baseline", "floor", "op")
        ]
        try:
            baseline, floor, candidate = (proxy.url for proxy in proxies)
            done = run_gate(
                baseline,
                candidate,
                corpus,
                policy,
                run / "out",
                run / "runs.sqlite3",
                "--floor",
                floor,
            )
        finally:
            for proxy in proxies:
                proxy.close()
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        spans = [span for proxy in proxies for span in proxy.generate_spans]
        assert all(proxy.generate_spans for proxy in proxies) and len(spans) >= 9, spans
        assert _overlap(spans) is not in_turn, (in_turn, sorted(spans))


def test_reference_targets_that_cannot_be_trusted_leave_the_run_undecided(
    servers, tmp_path: Path
) -> None:
    """Before: a floor that is the candidate behind another URL made every excess zero, and a
    floor with hard divergences of its own raised the bar: a faulty candidate PASSED both."""
    behind = ForwardingProxy(servers["kv_drop"])
    try:
        done, report, failing = _gate(
            servers, "kv_drop", tmp_path / "floor_is_candidate", floor=behind.url
        )
    finally:
        behind.close()
    reasons = {r["rule"]: r for r in report["verdict"]["reasons"]}
    assert done.returncode == 2 and "reference_targets" in failing, reasons
    assert "one server process" in reasons["reference_targets"]["message"]
    done, report, failing = _gate(
        servers, "op", tmp_path / "broken_floor", floor=servers["kv_drop"]
    )
    reasons = {r["rule"]: r for r in report["verdict"]["reasons"]}
    assert done.returncode == 2 and reasons["reference_targets"]["outcome"] == "undecided"
    assert "the A/A' floor" in reasons["reference_targets"]["message"], reasons


def test_model_info_names_the_process_and_the_options_that_change_the_numbers(servers) -> None:
    """What the gate checks its reference targets and a resume against. Before: no process
    identity, and a resume against another prefill chunk or thread count went unnoticed."""
    engines = [httpx.get(f"{servers[n]}/model_info").json()["kdtree_engine"] for n in servers]
    assert len({e["server_id"] for e in engines}) == len(engines)
    assert all(e["prefill_chunk"] >= 1 and e["threads"] >= 1 for e in engines), engines
    before = {"model_info": {"kdtree_engine": {**engines[0], "prefill_chunk": 16}}}
    after = {"model_info": {"kdtree_engine": engines[0]}}
    assert identity_differences(before, after) == [
        f"/model_info kdtree_engine.prefill_chunk: 16 -> {engines[0]['prefill_chunk']}"
    ]
