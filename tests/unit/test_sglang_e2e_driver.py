"""bench/sglang_e2e.py and bench/sglang_servers.py without a GPU: the command lines a user would
type for each configuration, the metrics parsing, and the refusals of bad arguments."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sglang_e2e
from sglang_servers import TP_ENV, ServerSpec


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
    specs = sglang_e2e.speed_specs(Path("/m"), list(sglang_e2e.MODES), 0.1, (), tp=2)
    by_name = {s.name: s for s in specs}
    assert by_name["speed_on_draft_triton"].mode == "on"
    assert by_name["speed_on_draft_triton"].env == {"KDTREE_DRAFT_EXTEND": "off"}
    assert {s.tp for s in specs} == {2}
    assert {s.graph_max_bs for s in specs} == {4}
    wide = sglang_e2e.speed_specs(Path("/m"), ["off"], 0.1, (), graph_max_bs=8)[0]
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
    err = capsys.readouterr().err
    assert (
        "no config.json" in err and "--tp must be at least 1" in err and "unknown ['fast']" in err
    )
    assert "--graph-max-bs must be at least 1, got 0" in err
