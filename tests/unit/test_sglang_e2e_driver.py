"""bench/kdtree_bench/e2e/sglang_e2e.py and bench/kdtree_bench/e2e/sglang_servers.py without a GPU: the command lines a user would
type for each configuration, the metrics parsing, the refusals of bad arguments, and how failed
server starts are retried."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

from kdtree_bench.e2e import sglang_e2e
from kdtree_bench.e2e.parity_resolution import SGLangServers
from kdtree_bench.e2e.sglang_servers import DRAFT_ATTENTION_BACKENDS, TP_ENV, ServerSpec


def test_flags_are_sglang_s_for_tree_chain_graphs_and_tp() -> None:
    tree = ServerSpec("a", "on", Path("/m")).flags(30000)
    assert tree[tree.index("--speculative-eagle-topk") + 1] == "4"
    assert tree[tree.index("--speculative-num-draft-tokens") + 1] == "8"
    assert tree[tree.index("--cuda-graph-max-bs-decode") + 1] == "4"
    assert "--tp-size" not in tree and "--disable-radix-cache" not in tree
    chain = ServerSpec("b", "off", Path("/m"), speculation="chain", cuda_graphs=False, tp=2)
    flags = chain.flags(30001)
    assert flags[flags.index("--speculative-eagle-topk") + 1] == "1"
    assert flags[flags.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert flags[flags.index("--tp-size") + 1] == "2"
    assert flags[flags.index("--port") + 1] == "30001"
    assert TP_ENV["NCCL_NVLS_ENABLE"] == "0"


def test_speed_specs_carry_the_draft_extend_switch_and_tp() -> None:
    configs = sglang_e2e.configurations(list(sglang_e2e.MODES), ["eagle"])
    specs = sglang_e2e.speed_specs(Path("/m"), configs, 0.1, (), tp=2)
    by_name = {s.name: s for s in specs}
    assert by_name["speed_on_draft_triton"].mode == "on"
    assert by_name["speed_on_draft_triton"].env == {"KDTREE_DRAFT_EXTEND": "off"}
    assert by_name["speed_on_fp16"].env == {"KDTREE_FP8_NUMERICS": "fp16"}
    assert {s.tp for s in specs} == {2}
    assert {s.graph_max_bs for s in specs} == {4}
    (off,) = sglang_e2e.configurations(["off"], ["eagle"])
    wide = sglang_e2e.speed_specs(Path("/m"), [off], 0.1, (), graph_max_bs=8)[0]
    flags = wide.flags(30002)
    assert flags[flags.index("--cuda-graph-max-bs-decode") + 1] == "8"
    assert wide.describe()["graph_max_bs"] == 8
    eager = ServerSpec("e", "off", Path("/m"), cuda_graphs=False).describe()
    assert eager["graph_max_bs"] == 0


def test_metric_sum_reads_labelled_samples_per_rank() -> None:
    text = (
        "# TYPE kdtree_verify_steps counter\n"
        'kdtree_verify_steps_total{tp_rank="0"} 5\n'
        'kdtree_verify_steps_total{tp_rank="1"} 7\n'
    )
    values = sglang_e2e.metric_values(text)
    assert sglang_e2e.metric_sum(values, "kdtree_verify_steps_total") == 12
    assert sglang_e2e.metric_sum(values, "kdtree_verify_steps_total", tp_rank="1") == 7


def test_bad_arguments_are_refused(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert sglang_e2e.main(["--model", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert sglang_e2e.main(["--model", str(tmp_path), "--out", str(tmp_path), "--tp", "0"]) == 2
    assert (
        sglang_e2e.main(["--model", str(tmp_path), "--out", str(tmp_path), "--modes", "fast"]) == 2
    )
    assert (
        sglang_e2e.main(["--model", str(tmp_path), "--out", str(tmp_path), "--graph-max-bs", "0"])
        == 2
    )
    assert (
        sglang_e2e.main(["--model", str(tmp_path), "--out", str(tmp_path), "--start-wave", "-1"])
        == 2
    )
    assert (
        sglang_e2e.main(["--model", str(tmp_path), "--out", str(tmp_path), "--pools-wait", "-5"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "no config.json" in err and "--tp must be at least 1" in err and "unknown ['fast']" in err
    )
    assert "--pools-wait must be 0 (off) or more seconds, got -5.0" in err
    assert "--graph-max-bs must be at least 1, got 0" in err
    assert "--start-wave must be 0 (all at once) or more, got -1" in err


def test_a_repetition_records_how_busy_the_host_was(tmp_path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (guest fields after are part of user)
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    before = sglang_e2e.cpu_jiffies(stat)
    assert before == (150, 1000)
    stat.write_text("cpu  400 0 150 900 50 0 0 0 0 0\n")
    after = sglang_e2e.cpu_jiffies(stat)
    # 400 of 500 jiffies busy: 80% of every CPU the host has.
    assert sglang_e2e.busy_cpus(before, after) == round(0.8 * (os.cpu_count() or 1), 2)
    assert sglang_e2e.busy_cpus(before, None) is None
    assert sglang_e2e.busy_cpus(after, before) is None
    assert sglang_e2e.cpu_jiffies(tmp_path / "missing") is None
    # The real host's reading, as the benchmark takes it.
    busy, total = sglang_e2e.cpu_jiffies()
    assert 0 <= busy <= total and total > 0


def test_host_samples_are_refused_without_py_spy(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("PATH", str(tmp_path))
    args = ["--model", str(tmp_path), "--out", str(tmp_path), "--host-samples"]
    assert sglang_e2e.main(args) == 2
    assert "--host-samples needs py-spy on PATH" in capsys.readouterr().err


def test_dflash_and_fp8_flags_are_sglang_s() -> None:
    spec = ServerSpec(
        "d",
        "on",
        Path("/m"),
        speculation="dflash",
        draft=Path("/drafts/d16"),
        kv_dtype="fp8_e4m3",
    )
    flags = spec.flags(30003)
    assert flags[flags.index("--speculative-algorithm") + 1] == "DFLASH"
    assert flags[flags.index("--speculative-draft-model-path") + 1] == "/drafts/d16"
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "16"
    # DFLASH forces steps and top-k to 1 itself; EAGLE's flags must not be there.
    assert "--speculative-eagle-topk" not in flags and "--speculative-num-steps" not in flags
    assert flags[flags.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    described = spec.describe()
    assert (described["spec"], described["kv_dtype"], described["block_size"]) == (
        "dflash",
        "fp8_e4m3",
        16,
    )
    assert described["draft"] == "d16" and described["draft_window"] is None
    assert "--speculative-draft-window-size" not in flags
    windowed = ServerSpec(
        "w", "on", Path("/m"), speculation="dflash", draft=Path("/d"), draft_window=4096
    )
    windowed_flags = windowed.flags(30005)
    assert windowed_flags[windowed_flags.index("--speculative-draft-window-size") + 1] == "4096"
    assert windowed.describe()["draft_window"] == 4096
    eagle = ServerSpec("e", "off", Path("/m"))
    assert "--kv-cache-dtype" not in eagle.flags(1)
    assert eagle.describe()["spec"] == "eagle" and eagle.describe()["kv_dtype"] == "bfloat16"
    assert "draft" not in eagle.describe()


def test_server_specs_refuse_inconsistent_speculation() -> None:
    with pytest.raises(ValueError, match="a draft model goes with dflash and ddtree"):
        ServerSpec("d", "on", Path("/m"), speculation="dflash")
    with pytest.raises(ValueError, match="a draft model goes with dflash and ddtree"):
        ServerSpec("t", "on", Path("/m"), speculation="ddtree")
    with pytest.raises(ValueError, match="a draft model goes with dflash and ddtree"):
        ServerSpec("e", "on", Path("/m"), draft=Path("/d"))
    with pytest.raises(ValueError, match="budget must be at least 1, got 0"):
        ServerSpec("t", "on", Path("/m"), speculation="ddtree", draft=Path("/d"), budget=0)
    with pytest.raises(ValueError, match="kv_dtype 'fp16'"):
        ServerSpec("e", "on", Path("/m"), kv_dtype="fp16")
    with pytest.raises(ValueError, match="speculation 'medusa'"):
        ServerSpec("e", "on", Path("/m"), speculation="medusa")
    with pytest.raises(ValueError, match="a draft window goes with dflash"):
        ServerSpec("e", "on", Path("/m"), draft_window=4096)
    with pytest.raises(ValueError, match="draft_window 8 is smaller than the block"):
        ServerSpec("d", "on", Path("/m"), speculation="dflash", draft=Path("/d"), draft_window=8)


def test_a_draft_attention_backend_goes_to_sglang_for_a_draft_model_only() -> None:
    for speculation in ("dflash", "ddtree"):
        spec = ServerSpec(
            "d", "on", Path("/m"), speculation=speculation, draft=Path("/d"), draft_attention="fa3"
        )
        flags = spec.flags(30006)
        assert flags[flags.index("--speculative-draft-attention-backend") + 1] == "fa3"
        assert spec.describe()["draft_attention"] == "fa3"
        unset = ServerSpec("d", "on", Path("/m"), speculation=speculation, draft=Path("/d"))
        assert "--speculative-draft-attention-backend" not in unset.flags(30006)
        assert unset.describe()["draft_attention"] is None
    for speculation in ("tree", "chain"):
        with pytest.raises(ValueError, match="a draft attention backend is for a draft model"):
            ServerSpec("e", "on", Path("/m"), speculation=speculation, draft_attention="fa3")
    with pytest.raises(ValueError, match="draft attention backend 'cutlass'"):
        ServerSpec(
            "d", "on", Path("/m"), speculation="dflash", draft=Path("/d"), draft_attention="cutlass"
        )
    assert "draft_attention" not in ServerSpec("e", "off", Path("/m")).describe()


def test_the_draft_attention_backends_are_sglangs_choices() -> None:
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

    assert set(DRAFT_ATTENTION_BACKENDS) == set(DRAFT_ATTENTION_BACKEND_CHOICES)


def test_the_draft_attention_option_is_refused_without_a_draft_model(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--out", str(tmp_path)]
    assert sglang_e2e.main([*base, "--draft-attention-backend", "fa3"]) == 2
    err = capsys.readouterr().err
    assert (
        "--draft-attention-backend is a draft model's: use it with --spec dflash or ddtree" in err
    )
    with pytest.raises(SystemExit):
        sglang_e2e.main([*base, "--draft-attention-backend", "cutlass"])
    args = sglang_e2e.build_parser().parse_args(
        [*base, "--spec", "ddtree", "--draft", str(tmp_path), "--draft-attention-backend", "triton"]
    )
    assert sglang_e2e.refusal(args) is None
    (spec,) = sglang_e2e.speed_specs(
        Path("/m"),
        sglang_e2e.configurations(["on"], ["ddtree"]),
        0.2,
        (),
        draft=Path("/d"),
        draft_attention="triton",
    )
    assert spec.draft_attention == "triton"


def test_modes_alternate_per_shape_and_per_repetition() -> None:
    modes = ["off", "on"]
    assert sglang_e2e.mode_order(modes, 0, 0) == ["off", "on"]
    assert sglang_e2e.mode_order(modes, 0, 1) == ["on", "off"]
    assert sglang_e2e.mode_order(modes, 1, 0) == ["on", "off"]
    three = ["off", "on", "on_draft_triton"]
    assert sglang_e2e.mode_order(three, 1, 0) == ["on_draft_triton", "on", "off"]
    # Over a shape's repetitions each mode is first as often as last (even repeats).
    firsts = [sglang_e2e.mode_order(three, 0, r)[0] for r in range(4)]
    assert firsts.count("off") == firsts.count("on_draft_triton") == 2


def test_every_server_warms_up_before_any_timing_and_is_timed_repeats_times() -> None:
    plan = sglang_e2e.measurement_plan(["off", "on"], shape=3, repeats=3)
    phases = [phase for phase, _, _ in plan]
    assert phases == ["warmup", "warmup"] + ["timed"] * 6
    assert sorted(mode for phase, _, mode in plan if phase == "warmup") == ["off", "on"]
    timed = [(r, m) for phase, r, m in plan if phase == "timed"]
    assert [m for _, m in timed] == ["on", "off", "off", "on", "on", "off"]
    assert sorted(r for r, m in timed if m == "on") == [0, 1, 2]


def test_records_report_the_median_with_min_and_max() -> None:
    samples = [
        {
            "tokens_per_s": 500.0,
            "step_ms": 5.0,
            "accept_length": 3.0,
            "wall_s": 0.5,
            "verify_steps_max": 80,
            "generated_tokens": 256,
            "cached_tokens_min": 1023,
            "output_ids_head": [5, 6],
            "started_at": 1796300000.0,
            "host_busy_cpus": 1.5,
        },
        {
            "tokens_per_s": 700.0,
            "step_ms": 4.0,
            "accept_length": 3.0,
            "wall_s": 0.4,
            "verify_steps_max": 80,
            "generated_tokens": 256,
            "cached_tokens_min": 1022,
            "output_ids_head": [5, 6],
            "started_at": 1796300001.0,
            "host_busy_cpus": 1.5,
        },
        {
            "tokens_per_s": 600.0,
            "step_ms": None,
            "accept_length": None,
            "wall_s": 0.45,
            "verify_steps_max": 0,
            "generated_tokens": 256,
            "cached_tokens_min": 1023,
            "output_ids_head": [5, 7],
            "started_at": 1796300002.0,
            "host_busy_cpus": 1.5,
        },
    ]
    summary = sglang_e2e.summarize(samples)
    assert summary["repeats"] == 3
    assert (summary["tokens_per_s"], summary["tokens_per_s_min"], summary["tokens_per_s_max"]) == (
        600.0,
        500.0,
        700.0,
    )
    # A repetition without verify steps has no step time: the others decide (median of two).
    assert summary["step_ms"] == 4.5 and summary["step_ms_min"] == 4.0
    record = sglang_e2e.shape_record(samples, {"prefill_s": 1.0, "warmup_s": 2.0}, [0, 1, 0])
    assert record["outputs_identical_across_repeats"] is False
    assert record["cached_tokens_min"] == 1022 and record["warmup_s"] == 2.0
    assert record["order_positions"] == [0, 1, 0] and len(record["samples"]) == 3
    # Each repetition keeps its start, to be lined up with the GPU's clock log.
    assert [s["started_at"] for s in record["samples"]] == [
        1796300000.0,
        1796300001.0,
        1796300002.0,
    ]
    assert all(s["host_busy_cpus"] == 1.5 for s in record["samples"])
    same = sglang_e2e.shape_record(samples[:2], {}, [0, 1])
    assert same["outputs_identical_across_repeats"] is True


def test_prompts_leave_out_the_draft_mask_token() -> None:
    prompts = sglang_e2e.random_prompts(4, 500, 8, seed=1, avoid=frozenset({7}))
    assert all(len(p) == 500 and 7 not in p and min(p) >= 2 for p in prompts)
    assert any(6 in p for p in prompts)
    assert sglang_e2e.draft_mask_token({"dflash_config": {"mask_token_id": 4095}}) == {4095}
    assert sglang_e2e.draft_mask_token({"architectures": ["DFlashDraftModel"]}) == frozenset()
    assert sglang_e2e.draft_mask_token(None) == frozenset()


def test_spec_and_kv_dtype_options_are_refused_when_inconsistent(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--out", str(tmp_path)]
    assert sglang_e2e.main([*base, "--spec", "dflash"]) == 2
    assert sglang_e2e.main([*base, "--draft", str(tmp_path)]) == 2
    assert sglang_e2e.main([*base, "--spec", "dflash", "--draft", str(tmp_path / "x")]) == 2
    assert sglang_e2e.main([*base, "--repeats", "0"]) == 2
    assert sglang_e2e.main([*base, "--draft-window", "4096"]) == 2
    assert (
        sglang_e2e.main(
            [*base, "--spec", "dflash", "--draft", str(tmp_path), "--draft-window", "15"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--draft-window is DFlash's: use it with --spec dflash" in err
    assert "--draft-window 15 is smaller than the block (16)" in err
    assert "--spec dflash needs --draft DIR" in err
    assert "--draft is a DFlash draft: use it with --spec dflash or ddtree" in err
    assert "no config.json in the draft" in err and "--repeats must be at least 1, got 0" in err
    with pytest.raises(SystemExit):
        sglang_e2e.main([*base, "--kv-dtype", "fp16"])
    args = sglang_e2e.build_parser().parse_args([*base, "--kv-dtype", "fp8"])
    assert sglang_e2e.KV_DTYPE_NAMES[args.kv_dtype] == "fp8_e4m3" and args.repeats == 3
    assert args.no_cuda_graphs is False


def test_speed_specs_carry_dflash_fp8_and_eager() -> None:
    specs = sglang_e2e.speed_specs(
        Path("/m"),
        sglang_e2e.configurations(["off", "on"], ["dflash"]),
        0.2,
        (),
        draft=Path("/d"),
        draft_window=2048,
        kv_dtype="fp8_e4m3",
        cuda_graphs=False,
    )
    assert {(s.spec, s.kv_dtype, s.draft, s.block_size, s.draft_window) for s in specs} == {
        ("dflash", "fp8_e4m3", Path("/d"), 16, 2048)
    }
    flags = specs[0].flags(30004)
    assert flags[flags.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert "--cuda-graph-max-bs-decode" not in flags


def test_shapes_are_batch_by_prompt_in_the_given_order() -> None:
    args = sglang_e2e.build_parser().parse_args(
        ["--model", "/m", "--out", "/o", "--shapes", "1x1024, 1x128000,8X32768"]
    )
    assert args.shapes == [(1024, 1), (128000, 1), (32768, 8)]
    assert sglang_e2e.build_parser().parse_args(["--model", "/m", "--out", "/o"]).shapes is None


@pytest.mark.parametrize("bad", ["1x", "x8", "0x1024", "8x-1", "eight", ","])
def test_malformed_shapes_are_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        sglang_e2e.parse_shapes(bad)


STAND_IN_HEAD = """
import functools, http.server, os, pathlib, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
name = pathlib.Path(args[args.index("--model-path") + 1]).name
root = pathlib.Path(os.environ["STAND_IN_DIR"])
def note(event):
    with (root / "timeline").open("a") as timeline:
        timeline.write(f"{event} {name}\\n")
note("start")
"""
STAND_IN_SERVE = """
note("serve")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root / "www"))
http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()
"""
RETRY_START = """
marker = root / f"failed_{name}"
if not marker.exists():  # the first start of each server fails, as a memory profile would
    marker.touch()
    time.sleep(0.3)
    sys.exit(1)
time.sleep(1.0)
"""
POOLS_START = """
# The imports: SGLang's take tens of seconds, longer than the other server's process start
# however loaded the machine is, so the stand-in's last until both have started (10 s at most).
deadline = time.monotonic() + 10.0
while time.monotonic() < deadline and sum(
    line.startswith("start ") for line in (root / "timeline").read_text().splitlines()
) < 2:
    time.sleep(0.05)
if os.environ.get("KDTREE_START_GATE"):  # where the plugin holds SGLang's scheduler
    from kdtree_inference.sglang.start_gate import hold_until_open

    hold_until_open(pathlib.Path(os.environ["KDTREE_START_GATE"]), 60)
    note("gate")
time.sleep(1.0)  # the memory profile, the weights, the pools
if os.environ.get("POOLS_LINE"):  # as SGLang 0.5.23 logs it, then its graphs take a while
    note("pools")
    print("[2026-12-04 15:45:33] Memory pool end. avail mem=117.65 GB", flush=True)
    print(os.environ["POOLS_LINE"], flush=True)
time.sleep(5.0)  # graph captures, or a start that takes long
"""


def stand_in_specs(tmp_path: Path, monkeypatch, start: str, **env: str) -> list[ServerSpec]:
    """Servers a and b as real kdtree-serve processes whose launcher (KDTREE_SGLANG_LAUNCHER) is a
    stand-in: it notes "start NAME" in tmp_path/timeline, runs ``start``, notes "serve NAME" and
    answers /health."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    launcher = tmp_path / "launcher.py"
    launcher.write_text(STAND_IN_HEAD + start + STAND_IN_SERVE)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env = {
        "KDTREE_SGLANG_LAUNCHER": f"{sys.executable} {launcher}",
        "STAND_IN_DIR": str(tmp_path),
        **env,
    }
    return [ServerSpec(name, "off", tmp_path / name, env=env) for name in ("a", "b")]


def timeline_of(tmp_path: Path) -> list[str]:
    return (tmp_path / "timeline").read_text().split("\n")[:-1]


def test_failed_starts_are_retried_one_at_a_time_after_the_wave(tmp_path, monkeypatch) -> None:
    """Stand-in servers whose first start fails: both retries wait for the wave, and the second
    starts once the first is ready."""
    from kdtree_bench.e2e.sglang_servers import start_all, stop_all

    specs = stand_in_specs(tmp_path, monkeypatch, RETRY_START)
    servers, failed = start_all(specs, tmp_path / "logs", timeout_s=60, stagger_s=0.0)
    try:
        assert failed == {} and sorted(servers) == ["a", "b"]
        timeline = timeline_of(tmp_path)
        # The wave's two first starts in either order; then the retries, one after the other.
        assert sorted(timeline[:2]) == ["start a", "start b"]
        assert timeline[2:] == ["start a", "serve a", "start b", "serve b"]
        assert (tmp_path / "logs" / "server_a.try1.log").is_file()
        assert (tmp_path / "logs" / "server_b.try1.log").is_file()
    finally:
        stop_all(servers)


@pytest.mark.parametrize(
    "pools_line",
    [
        "[2026-12-04 15:45:34] Capture target verify CUDA graph begin. backend=full, avail mem=1 GB",
        "[2026-12-02 04:41:11] max_total_num_tokens=3529292, chunked_prefill_size=8192",
        "",
    ],
)
def test_each_start_gate_opens_once_the_one_before_holds_its_memory_pools(
    tmp_path, monkeypatch, capsys, pools_line
) -> None:
    """Stand-in servers that wait at their start gate as the plugin holds SGLang's scheduler, log
    SGLang's line after their pools (a graph capture, or eager's scheduler summary) and answer 5 s
    later: both start at once, and b's gate opens on a's line, not once a answers. A log that
    never shows it holds b's gate only ``pools_wait_s``."""
    from kdtree_bench.e2e.sglang_servers import start_all, stop_all

    specs = stand_in_specs(tmp_path, monkeypatch, POOLS_START, POOLS_LINE=pools_line)
    wait_s = 30.0 if pools_line else 1.0
    servers, failed = start_all(
        specs, tmp_path / "logs", timeout_s=60, stagger_s=0.0, pools_wait_s=wait_s
    )
    try:
        assert failed == {} and sorted(servers) == ["a", "b"]
        timeline = timeline_of(tmp_path)
        # Both start (their imports) before either measures memory.
        assert sorted(timeline[:2]) == ["start a", "start b"]
        b_log = (tmp_path / "logs" / "server_b.log").read_text()
        if pools_line:
            assert timeline.index("gate a") < timeline.index("pools a") < timeline.index("gate b")
            assert "waiting for the start gate" in b_log
        else:
            assert "a: no sign of its memory pools after 1 s; opening b's start gate anyway" in (
                capsys.readouterr().out
            )
        assert timeline.index("gate b") < timeline.index("serve a")
        assert "logs/gates/b opened after" in b_log
    finally:
        stop_all(servers)


SLOW_A_START = """
time.sleep(4.0 if name == "a" else 0.3)
"""


def test_each_server_s_start_time_is_its_own(tmp_path, monkeypatch, capsys) -> None:
    """b answers seconds before a, which started first: b's time is when it answered, not when
    the wait for a was over."""
    from kdtree_bench.e2e.sglang_servers import start_all, stop_all

    specs = stand_in_specs(tmp_path, monkeypatch, SLOW_A_START)
    servers, failed = start_all(specs, tmp_path / "logs", timeout_s=60, stagger_s=0.0)
    try:
        assert failed == {}
        assert servers["b"].ready_after_s + 2.0 < servers["a"].ready_after_s
        out = capsys.readouterr().out
        assert out.index("[e2e] b ready after") < out.index("[e2e] a ready after")
    finally:
        stop_all(servers)


def test_speed_json_says_whether_every_shape_was_measured(tmp_path) -> None:
    """Written after every shape: a cut run's speed.json holds its records, marked incomplete."""
    args = sglang_e2e.build_parser().parse_args(
        ["--model", str(tmp_path), "--out", str(tmp_path / "out"), "--repeats", "5"]
    )
    config = {"kdtree_model": {"preset": "rank"}, "hidden_size": 7168, "vocab_size": 4096}
    server = argparse.Namespace(ready_after_s=66.0)
    records = [{"batch": 1, "prompt_len": 1024}]
    partial = sglang_e2e.speed_result(
        args, config, None, records, None, {"speed_on": server}, False
    )
    assert partial["complete"] is False and partial["records"] == records
    assert partial["repeats"] == 5 and partial["draft"] is None
    assert partial["model_config"]["hidden_size"] == 7168
    assert partial["ready_after_s"] == {"speed_on": 66.0}
    done = sglang_e2e.speed_result(args, config, None, records, None, {"speed_on": server}, True)
    assert done["complete"] is True


def test_ddtree_flags_are_the_plugins() -> None:
    """A DDTree server: the plugin's algorithm, the verify width budget + 1, no overlap."""
    spec = ServerSpec(
        "t", "on", Path("/m"), speculation="ddtree", draft=Path("/drafts/d16"), budget=64
    )
    flags = spec.flags(30006)
    assert flags[flags.index("--speculative-algorithm") + 1] == "DDTREE"
    assert flags[flags.index("--speculative-draft-model-path") + 1] == "/drafts/d16"
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "65"
    assert "--disable-overlap-schedule" in flags
    assert "--speculative-eagle-topk" not in flags and "--speculative-num-steps" not in flags
    described = spec.describe()
    assert (described["spec"], described["budget"], described["draft"]) == ("ddtree", 64, "d16")
    assert "block_size" not in described
    configs = sglang_e2e.configurations(["off", "on"], ["ddtree"], [8])
    specs = sglang_e2e.speed_specs(Path("/m"), configs, 0.2, (), draft=Path("/d"))
    assert {(s.spec, s.budget) for s in specs} == {("ddtree", 8)}
    assert [s.name for s in specs] == ["speed_off", "speed_on"]


def test_ddtree_options_are_refused_when_inconsistent(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--out", str(tmp_path)]
    draft = ["--draft", str(tmp_path)]
    assert sglang_e2e.main([*base, "--spec", "ddtree"]) == 2
    assert sglang_e2e.main([*base, "--spec", "ddtree", *draft, "--draft-window", "64"]) == 2
    assert sglang_e2e.main([*base, "--budget", "32"]) == 2
    err = capsys.readouterr().err
    assert "--spec ddtree needs --draft DIR" in err
    assert "--draft-window is DFlash's: use it with --spec dflash (DDTree's draft reads" in err
    assert "--budget is DDTree's: use it with --spec ddtree" in err
    with pytest.raises(SystemExit):
        sglang_e2e.main([*base, "--spec", "ddtree", *draft, "--budget", "0"])
    assert "--budget: expected positive integers, got '0'" in capsys.readouterr().err
    args = sglang_e2e.build_parser().parse_args([*base, "--spec", "ddtree", *draft])
    assert args.budget == [16] and sglang_e2e.refusal(args) is None


def test_several_algorithms_and_budgets_give_every_mode_a_server_each() -> None:
    configs = sglang_e2e.configurations(["off", "on"], ["ddtree", "dflash"], [8, 64])
    assert [(c.name, c.mode, c.spec, c.budget) for c in configs] == [
        ("off_ddtree_b8", "off", "ddtree", 8),
        ("on_ddtree_b8", "on", "ddtree", 8),
        ("off_ddtree_b64", "off", "ddtree", 64),
        ("on_ddtree_b64", "on", "ddtree", 64),
        ("off_dflash", "off", "dflash", 16),
        ("on_dflash", "on", "dflash", 16),
    ]
    # Reversed on alternate repetitions, each off stays next to its on.
    names = [c.name for c in configs]
    for repeat in range(2):
        order = sglang_e2e.mode_order(names, 0, repeat)
        for spec in ("ddtree_b8", "ddtree_b64", "dflash"):
            assert abs(order.index(f"off_{spec}") - order.index(f"on_{spec}")) == 1
    # One algorithm and one budget keep the plain mode names of every earlier record.
    assert [c.name for c in sglang_e2e.configurations(["off", "on"], ["ddtree"], [32])] == [
        "off",
        "on",
    ]
    specs = sglang_e2e.speed_specs(
        Path("/m"),
        sglang_e2e.configurations(["on"], ["eagle", "dflash", "ddtree"]),
        0.1,
        (),
        draft=Path("/d"),
        draft_window=512,
        draft_attention="triton",
    )
    assert [(s.name, s.spec, s.draft, s.draft_window, s.draft_attention) for s in specs] == [
        ("speed_on_eagle", "eagle", None, None, None),
        ("speed_on_dflash", "dflash", Path("/d"), 512, "triton"),
        ("speed_on_ddtree", "ddtree", Path("/d"), None, "triton"),
    ]


def test_several_algorithms_and_budgets_are_refused_when_inconsistent(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--out", str(tmp_path), "--draft", str(tmp_path)]
    assert sglang_e2e.main([*base, "--spec", "ddtree", "--budget", "8,16,8"]) == 2
    assert sglang_e2e.main([*base, "--spec", "dflash,eagle", "--budget", "8,64"]) == 2
    assert sglang_e2e.main([*base[:4], "--spec", "eagle,ddtree"]) == 2
    err = capsys.readouterr().err
    assert "--budget names a budget twice: [8, 16, 8]" in err
    assert "--budget is DDTree's: use it with --spec ddtree" in err
    assert "--spec eagle,ddtree needs --draft DIR" in err
    for bad in ("ddtree,ddtree", "medusa", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            sglang_e2e.parse_specs(bad)
    args = sglang_e2e.build_parser().parse_args(
        [*base, "--spec", "ddtree,dflash", "--budget", "8,64", "--draft-window", "1024"]
    )
    assert sglang_e2e.refusal(args) is None
    assert (args.spec, args.budget) == (["ddtree", "dflash"], [8, 64])


STAND_IN_GENERATE = """
import http.server, json, os, pathlib, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
name = "-".join(
    (
        args[args.index("--speculative-algorithm") + 1],
        args[args.index("--speculative-num-draft-tokens") + 1],
        os.environ["KDTREE_VERIFY"],
    )
)
calls = pathlib.Path(os.environ["STAND_IN_DIR"]) / "calls"
class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.answer(b"ok" if self.path == "/health" else b"# " + name.encode() + b"\\n")
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        new = request["sampling_params"]["max_new_tokens"]
        with calls.open("a") as log:
            log.write(f"{name} {new}\\n")
        if len(calls.read_text().splitlines()) == int(os.environ.get("STAND_IN_HANG_AT", 0)):
            time.sleep(600)  # a generation the run's time limit cuts
        # An accept length of 2 at DFlash's width and of 4 at DDTree's: -(-new // n) steps.
        per_step = 4 if name.startswith("DDTREE") else 2
        self.answer(json.dumps([
            {
                "output_ids": list(range(new)),
                "meta_info": {
                    "completion_tokens": new,
                    "spec_verify_ct": -(-new // per_step),
                    "cached_tokens": len(ids) - 1,
                },
            }
            for ids in request["input_ids"]
        ]).encode())
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def stand_in_ddtree_run(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A target and a DFlash draft (their configs only) and the environment under which
    sglang_e2e starts STAND_IN_GENERATE instead of SGLang's launcher, logging calls to tmp_path."""
    import json

    model, draft = tmp_path / "rank", tmp_path / "rank-dflash"
    model.mkdir()
    draft.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 64}))
    (draft / "config.json").write_text(json.dumps({"dflash_config": {"mask_token_id": 63}}))
    launcher = tmp_path / "launcher.py"
    launcher.write_text(STAND_IN_GENERATE)
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "KDTREE_SGLANG_LAUNCHER": f"{sys.executable} {launcher}",
        "STAND_IN_DIR": str(tmp_path),
    }
    return model, draft, env


def test_a_run_of_several_budgets_and_algorithms_measures_each_server_in_one_order(
    tmp_path, monkeypatch
) -> None:
    """Real kdtree-serve processes (``off``: ``on`` refuses a host without CUDA) with a stand-in
    for SGLang's launcher that answers /generate:
    one run serves DDTree at budgets 8 and 64 beside DFlash, warms every server up before any
    timing, and writes a record per configuration whose server names its algorithm and budget."""
    import json

    model, draft, stand_in_env = stand_in_ddtree_run(tmp_path)
    for name, value in stand_in_env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    code = sglang_e2e.main(
        [
            "--model",
            str(model),
            "--out",
            str(out),
            "--draft",
            str(draft),
            "--spec",
            "ddtree,dflash",
            "--budget",
            "8,64",
            "--modes",
            "off",
            "--shapes",
            "1x32,2x16",
            "--repeats",
            "2",
            "--new-tokens",
            "12",
            "--warmup-tokens",
            "4",
        ]
    )
    assert code == 0
    speed = json.loads((out / "speed.json").read_text())
    assert speed["complete"] is True
    found = {
        (r["server"]["name"], r["batch"], r["spec"], r["configuration"], r["server"].get("budget"))
        for r in speed["records"]
    }
    assert found == {
        (f"speed_off_{name}", batch, spec, "off", budget)
        for name, spec, budget in (
            ("ddtree_b8", "ddtree", 8),
            ("ddtree_b64", "ddtree", 64),
            ("dflash", "dflash", None),
        )
        for batch in (1, 2)
    }
    accept = {(r["spec"], r["accept_length"]) for r in speed["records"]}
    assert accept == {("ddtree", 4.0), ("dflash", 2.0)}
    assert all(r["repeats"] == 2 and "error" not in r for r in speed["records"])
    # Per shape: the three prefills and warm-ups, then the timed calls in alternating order.
    calls = (tmp_path / "calls").read_text().split("\n")[:-1]
    widths = {"DDTREE-9-off": "b8", "DDTREE-65-off": "b64", "DFLASH-16-off": "dflash"}
    first_shape = [(widths[c.split()[0]], int(c.split()[1])) for c in calls[:12]]
    assert [new for _, new in first_shape] == [1, 4] * 3 + [12] * 6
    assert [server for server, _ in first_shape[6:]] == [
        "b8",
        "b64",
        "dflash",
        "dflash",
        "b64",
        "b8",
    ]
    assert sorted(f.name for f in out.glob("metrics_*.txt")) == [
        "metrics_speed_off_ddtree_b64.txt",
        "metrics_speed_off_ddtree_b8.txt",
        "metrics_speed_off_dflash.txt",
    ]
    # The committed record keeps six rows, the budgets and algorithms apart.
    from kdtree_bench.analysis import merge_e2e

    rows = merge_e2e.merge({"records": []}, [("run1", speed)])["records"]
    assert len({merge_e2e.row_key(r) for r in rows}) == len(rows) == 6


def test_a_shape_cut_by_sigint_keeps_the_repetitions_measured(tmp_path) -> None:
    """SIGINT (the device command's limit, ``timeout -s INT``) while the second repetition of a
    shape runs, to a run started with SIGINT ignored: speed.json keeps each server's first
    repetition, marked cut and incomplete, and every server stops."""
    import json
    import signal
    import subprocess
    import time

    model, draft, stand_in_env = stand_in_ddtree_run(tmp_path)
    calls, out = tmp_path / "calls", tmp_path / "out"
    env = {
        **os.environ,
        **stand_in_env,
        # Two warm-up calls per server, then one timed call each: the seventh call hangs.
        "STAND_IN_HANG_AT": "7",
    }
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "kdtree_bench.e2e.sglang_e2e", "--model", str(model)),
            *("--out", str(out), "--draft", str(draft), "--spec", "ddtree", "--budget", "8,64"),
            *("--modes", "off", "--shapes", "1x32", "--repeats", "2", "--new-tokens", "12"),
            *("--warmup-tokens", "4"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As a background job of a non-interactive shell starts it: SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        while not (calls.exists() and len(calls.read_text().splitlines()) == 7):
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        log, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, log
    speed = json.loads((out / "speed.json").read_text())
    assert speed["complete"] is False
    records = {r["server"]["name"]: r for r in speed["records"]}
    assert sorted(records) == ["speed_off_b64", "speed_off_b8"]
    for record in records.values():
        assert record["repeats"] == 1 and len(record["samples"]) == 1
        assert record["error"] == "cut after 1 of 2 timed repetitions"
        assert record["accept_length"] == 4.0
    # The log keeps the records too (what merge_e2e reads when speed.json is lost).
    assert len(sglang_e2e.records_in_log(log)) == 2
    import socket

    for record in records.values():
        flags = record["server_flags"]
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(flags[flags.index("--port") + 1])), 2)


RECORD_ARGS = """
(root / f"args_{name}").write_text("\\n".join(args))
"""


def stand_in_gate_run_servers(
    tmp_path: Path, monkeypatch, start: str, preset: str = "rank", **kwargs
) -> tuple[SGLangServers, dict[str, str]]:
    """The gate runs' SGLang servers for ``preset`` on the stand-in launcher, its model written
    already (no GPU needed here), and the environment that starts a stand-in server."""
    env = stand_in_specs(tmp_path, monkeypatch, start, **kwargs.pop("stand_in_env", {}))[0].env
    model_dir = tmp_path / preset
    model_dir.mkdir()
    (model_dir / "model.safetensors").touch()
    return SGLangServers(model_dir, preset, timeout_s=60, **kwargs), env


@pytest.mark.parametrize(
    ("preset", "override", "expected"),
    [("kimi-rank", None, "0.16"), ("rank", None, "0.08"), ("kimi-rank", 0.3, "0.3")],
)
def test_gate_run_servers_take_the_preset_s_memory_fraction(
    tmp_path, monkeypatch, preset, override, expected
) -> None:
    """The long-context and resolution runs' SGLang servers: kimi-rank's weights need more of the
    card than ServerSpec's default, which SGLang would refuse at its start; an explicit
    fraction wins."""
    start, env = stand_in_gate_run_servers(
        tmp_path, monkeypatch, RECORD_ARGS, preset, mem_fraction=override
    )
    (tmp_path / "raw" / "servers").mkdir(parents=True)
    with start(tmp_path / "raw", "baseline", {"KDTREE_VERIFY": "off", **env}):
        args = (tmp_path / f"args_{preset}").read_text().split("\n")
    assert args[args.index("--mem-fraction-static") + 1] == expected


def test_gate_run_servers_start_together_and_stop_after(tmp_path, monkeypatch) -> None:
    """The long-context run's servers: both start (their imports) before either measures its
    memory, each answers at the URL given for its tag, and both are stopped after the block."""
    from kdtree_inference.engine.launch import health_status

    pools = "[2026-12-02 04:41:11] max_total_num_tokens=3529292, chunked_prefill_size=8192"
    servers, env = stand_in_gate_run_servers(
        tmp_path, monkeypatch, POOLS_START, stand_in_env={"POOLS_LINE": pools}
    )
    wanted = [(tag, {"KDTREE_VERIFY": "off", **env}, None) for tag in ("baseline", "floor")]
    with servers.together(tmp_path / "raw", wanted) as urls:
        assert sorted(urls) == ["baseline", "floor"]
        assert all(health_status(url) == 200 for url in urls.values())
    assert all(health_status(url) != 200 for url in urls.values())
    timeline = timeline_of(tmp_path)
    assert timeline[:3] == ["start rank", "start rank", "gate rank"]
    first_gate, second_gate = [i for i, event in enumerate(timeline) if event == "gate rank"]
    assert first_gate < timeline.index("pools rank") < second_gate  # memory profiles take turns


def test_gate_run_servers_that_fail_to_start_are_named(tmp_path, monkeypatch) -> None:
    """A server that exits at its start (twice: it is retried once) stops the run with its name."""
    servers, env = stand_in_gate_run_servers(tmp_path, monkeypatch, "sys.exit(3)\n")
    with (
        pytest.raises(RuntimeError, match=r"servers that did not start: .*'baseline'"),
        servers.together(tmp_path / "raw", [("baseline", env, None)]),
    ):
        pass


def test_the_verify_width_is_the_draft_tokens_flag_sglang_gets() -> None:
    for spec, width in [
        (ServerSpec("t", "on", Path("/m")), 8),
        (ServerSpec("c", "on", Path("/m"), speculation="chain"), 4),
        (ServerSpec("d", "on", Path("/m"), speculation="dflash", draft=Path("/d")), 16),
        (ServerSpec("b", "on", Path("/m"), speculation="ddtree", draft=Path("/d"), budget=32), 33),
    ]:
        flags = spec.flags(30000)
        assert flags[flags.index("--speculative-num-draft-tokens") + 1] == str(width)
        assert spec.verify_width == width


def test_kv_tokens_auto_caps_every_pool_at_the_largest_shape_s_need(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--out", str(tmp_path), "--shapes", "1x32768,8x1024"]
    ddtree = ["--spec", "ddtree,dflash", "--draft", str(tmp_path), "--budget", "32"]
    args = sglang_e2e.build_parser().parse_args([*base, *ddtree, "--kv-tokens", "auto"])
    assert sglang_e2e.refusal(args) is None
    configs = sglang_e2e.configurations(args.modes, args.spec, args.budget)
    specs = sglang_e2e.run_server_specs(args, configs)
    # The widest server verifies DDTree's 33 nodes; 1 x 32k outweighs 8 x 1k.
    need = 1 * (32768 + max(args.new_tokens, args.warmup_tokens, args.profile_tokens) + 2 * 33)
    assert sglang_e2e.kv_tokens_need(args, specs) == need
    cap = need + max(4096, -(-need // 10))
    assert {spec.kv_tokens for spec in specs} == {cap} and len(specs) == 6
    for spec in specs:
        flags = spec.flags(30000)
        assert flags[flags.index("--max-total-tokens") + 1] == str(cap)
        assert spec.describe()["kv_tokens"] == cap
    uncapped = sglang_e2e.build_parser().parse_args([*base, *ddtree])
    for spec in sglang_e2e.run_server_specs(uncapped, configs):
        assert "--max-total-tokens" not in spec.flags(30000)
        assert "kv_tokens" not in spec.describe()


def test_a_kv_cap_too_small_for_a_shape_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    base = ["--model", str(tmp_path), "--out", str(tmp_path), "--shapes", "1x1024,1x32768"]
    assert sglang_e2e.main([*base, "--kv-tokens", "30000"]) == 2
    err = capsys.readouterr().err
    assert "--kv-tokens 30000 cannot hold the largest shape, which needs 33040 KV slots" in err
    for bad in ("0", "lots"):
        with pytest.raises(SystemExit):
            sglang_e2e.main([*base, "--kv-tokens", bad])
        assert "--kv-tokens" in capsys.readouterr().err
    args = sglang_e2e.build_parser().parse_args([*base, "--kv-tokens", "33040"])
    assert sglang_e2e.refusal(args) is None
