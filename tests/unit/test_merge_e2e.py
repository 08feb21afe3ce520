"""bench/kdtree_bench/analysis/merge_e2e.py: a run's speed.json rows replace the committed rows that measured the same
configuration and shape, every other row keeps its run and log, and bad input is refused."""

from __future__ import annotations

import copy
import json
import re
import tarfile
from pathlib import Path

import pytest

from kdtree_bench.analysis import merge_e2e
from kdtree_bench.e2e import sglang_e2e
from kdtree_bench.e2e.sglang_servers import ServerSpec

COMMITTED = Path(__file__).resolve().parents[2] / "bench" / "results" / "sglang_e2e_h200.json"


def speed_record(spec: ServerSpec, configuration: str, batch: int, prompt_len: int, tok_s: float):
    """A record as sglang_e2e.py writes it, built with its own functions."""
    samples = [
        {
            "tokens_per_s": tok_s + d,
            "step_ms": 5.0,
            "accept_length": 3.1,
            "wall_s": 0.4,
            "verify_steps_max": 80,
            "generated_tokens": 256,
            "cached_tokens_min": prompt_len - 1,
            "output_ids_head": [3, 4],
            "started_at": 1796300000.0 + d,
            "host_busy_cpus": 1.2,
        }
        for d in (-10.0, 0.0, 10.0)
    ]
    record = {"batch": batch, "prompt_len": prompt_len, "new_tokens": 256}
    record.update(sglang_e2e.shape_record(samples, {"prefill_s": 0.1, "warmup_s": 0.2}, [0, 1, 0]))
    record.update(
        mode=spec.mode,
        configuration=configuration,
        server=spec.describe(),
        server_flags=spec.flags(30000),
        log=f"server_{spec.name}.log",
        model="rank",
        spec=spec.spec,
        kv_dtype=spec.kv_dtype,
    )
    return record


def speed_json(records: list[dict]) -> dict:
    return {
        "model": {"preset": "rank", "seed": 0},
        "model_config": {"hidden_size": 7168},
        "new_tokens": 256,
        "repeats": 3,
        "warmup_tokens": 64,
        "records": records,
    }


@pytest.fixture()
def committed() -> dict:
    return json.loads(COMMITTED.read_text())


def run_files(value: object) -> list[str]:
    """Every ``runN/...`` file (``FILE.tar.xz:MEMBER`` for a file packed in a run's tarball) that a
    record names, at any depth."""
    if isinstance(value, dict):
        return [f for v in value.values() for f in run_files(v)]
    if isinstance(value, list):
        return [f for v in value for f in run_files(v)]
    return [value] if isinstance(value, str) and re.match(r"run\d+/\S+$", value) else []


def missing_run_files(record: dict, runs: Path) -> list[str]:
    missing = []
    for name in sorted(set(run_files(record))):
        path, _, member = name.partition(":")
        if not (runs / path).is_file():
            missing.append(name)
        elif member:
            with tarfile.open(runs / path) as tar:
                if member not in tar.getnames():
                    missing.append(name)
    return missing


def test_every_file_the_committed_record_names_is_in_the_tree(committed: dict) -> None:
    names = run_files(committed)
    assert len(names) > 40 and any(":" in n for n in names)
    assert missing_run_files(committed, COMMITTED.parent / "sglang_e2e") == []


def test_a_missing_run_file_or_packed_member_is_named(tmp_path: Path) -> None:
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "speed.json").write_text("{}")
    with tarfile.open(tmp_path / "run1" / "speed.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "run1" / "speed.json", arcname="speed/server_off.log")
    record = {
        "records": [{"log": "run1/speed.tar.xz:speed/server_off.log"}, {"log": "server_on.log"}],
        "refused": {"log": "run1/speed.json", "other": ["run2/speed.json"]},
        "verdict": {"report": "run1/speed.tar.xz:speed/server_on.log"},
    }
    assert missing_run_files(record, tmp_path) == [
        "run1/speed.tar.xz:speed/server_on.log",
        "run2/speed.json",
    ]


def test_new_rows_replace_the_same_measurement_and_keep_the_rest(committed) -> None:
    eagle = ServerSpec("speed_off", "off", Path("/tmp/models/rank"))
    dflash = ServerSpec(
        "speed_on", "on", Path("/tmp/models/rank"), speculation="dflash", draft=Path("/d")
    )
    # A prompt length no committed row has: the rows below meet only each other.
    first = speed_json([speed_record(eagle, "off", 1, 1000, 500.0)])
    before = merge_e2e.merge(committed, [("run90", first)])
    run = speed_json(
        [speed_record(eagle, "off", 1, 1000, 700.0), speed_record(dflash, "on", 1, 1000, 900.0)]
    )
    merged = merge_e2e.merge(copy.deepcopy(before), [("run91", run)])
    old_key = merge_e2e.row_key(next(r for r in before["records"] if r["run"] == "run90"))
    replaced = [r for r in merged["records"] if merge_e2e.row_key(r) == old_key]
    assert len(replaced) == 1 and replaced[0]["run"] == "run91"
    assert replaced[0]["tokens_per_s"] == 700.0 and replaced[0]["tokens_per_s_min"] == 690.0
    assert replaced[0]["log"] == "run91/speed.tar.xz:speed/server_speed_off.log"
    # The DFlash row is new; everything else is the committed rows, untouched.
    assert len(merged["records"]) == len(before["records"]) + 1
    added = merged["records"][-1]
    assert (added["spec"], added["speculation"], added["block_size"]) == ("dflash", "dflash", 16)
    untouched = [r for r in merged["records"] if r.get("run") != "run91"]
    assert untouched == [r for r in before["records"] if merge_e2e.row_key(r) != old_key]
    assert untouched == committed["records"]
    for key in before:
        if key not in ("records", "runs"):
            assert merged[key] == before[key], key
    assert merged["runs"]["run91"]["repeats"] == 3 and "rank" in merged["models"]
    assert "server" not in added and "output_ids_head" not in added


def test_a_draft_window_is_its_own_measurement(committed) -> None:
    """DFlash with a draft window measures something else than with the whole context."""
    full = ServerSpec("speed_on", "on", Path("/m"), speculation="dflash", draft=Path("/d"))
    windowed = ServerSpec(
        "speed_on", "on", Path("/m"), speculation="dflash", draft=Path("/d"), draft_window=4096
    )
    merged = merge_e2e.merge(
        copy.deepcopy(committed),
        [("run92", speed_json([speed_record(full, "on", 1, 1000, 900.0)]))],
    )
    merged = merge_e2e.merge(
        merged, [("run93", speed_json([speed_record(windowed, "on", 1, 1000, 1200.0)]))]
    )
    new_rows = merged["records"][len(committed["records"]) :]
    assert [(r["run"], r.get("draft_window")) for r in new_rows] == [
        ("run92", None),
        ("run93", 4096),
    ]
    assert merge_e2e.row_key(new_rows[0]) != merge_e2e.row_key(new_rows[1])


def test_a_draft_attention_backend_is_its_own_measurement(committed) -> None:
    """DFlash with another draft attention backend measures something else: its rows never
    replace those of SGLang's default backend, nor of another one."""
    default, fa3, triton = (
        ServerSpec(
            "speed_on", "on", Path("/m"), speculation="dflash", draft=Path("/d"), draft_attention=b
        )
        for b in (None, "fa3", "triton")
    )
    merged = copy.deepcopy(committed)
    for run, spec in (("run95", default), ("run96", fa3), ("run97", triton)):
        merged = merge_e2e.merge(
            merged, [(run, speed_json([speed_record(spec, "on", 1, 1000, 900.0)]))]
        )
    new_rows = merged["records"][len(committed["records"]) :]
    assert [(r["run"], r.get("draft_attention")) for r in new_rows] == [
        ("run95", None),
        ("run96", "fa3"),
        ("run97", "triton"),
    ]
    assert len({merge_e2e.row_key(r) for r in new_rows}) == 3
    # The same backend again replaces its own row only.
    again = merge_e2e.merge(
        copy.deepcopy(merged), [("run98", speed_json([speed_record(fa3, "on", 1, 1000, 950.0)]))]
    )
    assert [r["run"] for r in again["records"][len(committed["records"]) :]] == [
        "run95",
        "run98",
        "run97",
    ]


def test_each_ddtree_budget_is_its_own_measurement(committed) -> None:
    """DDTree at budget 8 and at 64 are two configurations of one shape, not one replacing the
    other; the shape names its budget."""
    small, large = (
        ServerSpec("speed_on", "on", Path("/m"), speculation="ddtree", draft=Path("/d"), budget=b)
        for b in (8, 64)
    )
    merged = merge_e2e.merge(
        copy.deepcopy(committed),
        [("run94", speed_json([speed_record(small, "on", 1, 1000, 900.0)]))],
    )
    merged = merge_e2e.merge(
        merged, [("run95", speed_json([speed_record(large, "on", 1, 1000, 700.0)]))]
    )
    new_rows = merged["records"][len(committed["records"]) :]
    assert [(r["run"], r["spec"], r["budget"], r["draft"]) for r in new_rows] == [
        ("run94", "ddtree", 8, "d"),
        ("run95", "ddtree", 64, "d"),
    ]
    assert merge_e2e.describe_shape(new_rows[1]) == "rank ddtree bfloat16 1x1000 budget 64"


def test_further_server_arguments_are_their_own_measurement(committed) -> None:
    """A run with, say, another draft attention backend replaces none of the stock rows."""
    stock = ServerSpec("speed_on", "on", Path("/m"), speculation="dflash", draft=Path("/d"))
    flashinfer_draft = ServerSpec(
        "speed_on",
        "on",
        Path("/m"),
        speculation="dflash",
        draft=Path("/d"),
        extra=("--speculative-draft-attention-backend", "flashinfer"),
    )
    merged = merge_e2e.merge(
        copy.deepcopy(committed),
        [
            ("run94", speed_json([speed_record(stock, "on", 1, 1000, 900.0)])),
            ("run95", speed_json([speed_record(flashinfer_draft, "on", 1, 1000, 1500.0)])),
        ],
    )
    new_rows = merged["records"][len(committed["records"]) :]
    assert [(r["run"], r.get("extra_args")) for r in new_rows] == [
        ("run94", None),
        ("run95", "--speculative-draft-attention-backend flashinfer"),
    ]


def test_a_retired_run_leaves_the_record_and_is_named(committed, tmp_path, capsys) -> None:
    eagle = ServerSpec("speed_on", "on", Path("/m"))
    failed = {**speed_record(eagle, "on", 8, 1024, 1.0), "error": "HTTP 500"}
    rows = [speed_record(eagle, "on", 1, 1000, 600.0), failed]
    record = merge_e2e.merge(committed, [("run90", speed_json(rows))])
    retired = merge_e2e.retire(record, ["run90"])
    assert retired["records"] == committed["records"]
    assert "run90" not in retired["runs"] and "run90" in retired["retired"]
    assert all(r["run"] != "run90" for r in retired.get("failed_records", []))
    with pytest.raises(merge_e2e.MergeError, match=r"cannot retire \['run77'\]"):
        merge_e2e.retire(record, ["run77"])
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    assert merge_e2e.main([str(path), "--retire", "run90"]) == 0
    assert json.loads(path.read_text())["records"] == committed["records"]
    assert "retired run90" in capsys.readouterr().out
    assert merge_e2e.main([str(path)]) == 2
    assert "nothing to do" in capsys.readouterr().err


def test_failed_records_replace_nothing_and_are_kept(committed) -> None:
    eagle = ServerSpec("speed_on", "on", Path("/tmp/models/rank"))
    failed = {**speed_record(eagle, "on", 1, 1024, 1.0), "error": "HTTP 500"}
    merged = merge_e2e.merge(committed, [("run9", speed_json([failed]))])
    assert merged["records"] == committed["records"]
    assert merged["failed_records"][0]["error"] == "HTTP 500"
    assert merged["failed_records"][0]["run"] == "run9"


def test_a_run_already_in_the_record_is_refused(committed, tmp_path, capsys) -> None:
    eagle = ServerSpec("speed_off", "off", Path("/m"))
    with pytest.raises(merge_e2e.MergeError, match="run 'run18' is already in the record"):
        merge_e2e.merge(committed, [("run18", speed_json([speed_record(eagle, "off", 1, 1, 1.0)]))])
    record = tmp_path / "record.json"
    record.write_text(json.dumps(committed))
    (tmp_path / "speed.json").write_text(json.dumps({"records": []}))
    assert merge_e2e.main([str(record), f"run9={tmp_path / 'speed.json'}"]) == 2
    assert "run9: no records in its speed.json" in capsys.readouterr().err
    assert json.loads(record.read_text()) == committed  # nothing written on refusal


def test_the_cli_rewrites_the_record_in_its_committed_format(committed, tmp_path) -> None:
    record = tmp_path / "record.json"
    record.write_text(json.dumps(committed, indent=1) + "\n")
    eagle = ServerSpec("speed_on", "on", Path("/m"), kv_dtype="fp8_e4m3")
    (tmp_path / "speed.json").write_text(
        json.dumps(speed_json([speed_record(eagle, "on", 8, 32768, 2000.0)]))
    )
    assert merge_e2e.main([str(record), f"run10={tmp_path / 'speed.json'}"]) == 0
    text = record.read_text()
    merged = json.loads(text)
    assert text == json.dumps(merged, indent=1) + "\n"
    assert merged["records"][-1]["kv_dtype"] == "fp8_e4m3"
    assert len(merged["records"]) == len(committed["records"]) + 1


def test_a_run_cut_before_its_speed_json_is_merged_from_its_log(committed, tmp_path) -> None:
    """The records a cut run printed as it measured them, and its servers' start times."""
    dflash = ServerSpec("speed_on", "on", Path("/m"), speculation="dflash", draft=Path("/d"))
    records = [
        speed_record(dflash, "on", 1, 1024, 500.0),
        speed_record(dflash, "on", 1, 8192, 400.0),
    ]
    log = tmp_path / "speed.log"
    log.write_text(
        "make_model: rank seed 0\n[e2e] speed_on ready after 66 s at http://127.0.0.1:1\n"
        + "".join(f"[e2e] {json.dumps(r)}\n" for r in records)
        + "Traceback (most recent call last):\nKeyboardInterrupt\n"
    )
    record = tmp_path / "record.json"
    record.write_text(json.dumps(committed))
    assert merge_e2e.main([str(record), f"run90={log}"]) == 0
    merged = json.loads(record.read_text())
    new = [r for r in merged["records"] if r["run"] == "run90"]
    assert [(r["prompt_len"], r["tokens_per_s"]) for r in new] == [(1024, 500.0), (8192, 400.0)]
    assert merged["runs"]["run90"] == {
        "new_tokens": 256,
        "repeats": 3,
        "warmup_tokens": None,
        "ready_after_s": {"speed_on": 66.0},
        "from_log": True,
    }
    log.write_text("[e2e] speed_on ready after 66 s\nKeyboardInterrupt\n")  # cut before a record
    record.write_text(json.dumps(committed))
    assert merge_e2e.main([str(record), f"run91={log}"]) == 2


def test_a_shape_keeps_the_configurations_of_one_run(committed, tmp_path, capsys) -> None:
    """A run that measures only some configurations of a shape would pair its rows with another
    run's: refused, naming the shape and runs, unless --drop-stale drops the older rows."""
    off = ServerSpec("speed_off", "off", Path("/m"), speculation="dflash", draft=Path("/d"))
    on = ServerSpec("speed_on", "on", Path("/m"), speculation="dflash", draft=Path("/d"))
    pair = speed_json(
        [speed_record(off, "off", 8, 1000, 500.0), speed_record(on, "on", 8, 1000, 600.0)]
    )
    before = merge_e2e.merge(committed, [("run90", pair)])
    diagnostic = speed_json([speed_record(off, "off", 8, 1000, 450.0)])
    with pytest.raises(
        merge_e2e.MergeError,
        match=r"rank dflash bfloat16 8x1000 \(run91: off; run90: on\).*--drop-stale",
    ):
        merge_e2e.merge(copy.deepcopy(before), [("run91", diagnostic)])

    dropped = merge_e2e.merge(copy.deepcopy(before), [("run91", diagnostic)], drop_stale=True)
    shape = [r for r in dropped["records"] if (r["batch"], r["prompt_len"]) == (8, 1000)]
    assert [(r["run"], r["configuration"]) for r in shape] == [("run91", "off")]
    assert dropped["records"][: len(committed["records"])] == committed["records"]

    # Two new runs that split one shape between them are refused even with --drop-stale.
    other_on = speed_json([speed_record(on, "on", 8, 1000, 650.0)])
    with pytest.raises(merge_e2e.MergeError, match="the new runs split those shapes"):
        merge_e2e.merge(
            copy.deepcopy(before), [("run91", diagnostic), ("run92", other_on)], drop_stale=True
        )

    record = tmp_path / "record.json"
    record.write_text(json.dumps(before))
    (tmp_path / "speed.json").write_text(json.dumps(diagnostic))
    assert merge_e2e.main([str(record), f"run91={tmp_path / 'speed.json'}"]) == 2
    assert "different runs" in capsys.readouterr().err
    assert json.loads(record.read_text()) == before  # nothing written on refusal
    assert merge_e2e.main([str(record), f"run91={tmp_path / 'speed.json'}", "--drop-stale"]) == 0
    assert "dropped stale rows: run90 on rank dflash bfloat16 8x1000" in capsys.readouterr().out


def test_a_model_of_another_depth_has_rows_and_a_model_entry_of_its_own(committed) -> None:
    eagle = ServerSpec("speed_off", "off", Path("/m"))
    shallow = speed_json([speed_record(eagle, "off", 1, 1000, 500.0)])
    deep_record = {**speed_record(eagle, "off", 1, 1000, 80.0), "model": "rank-61-layers"}
    deep = {
        **speed_json([deep_record]),
        "model": {"preset": "rank", "name": "rank-61-layers", "seed": 0},
        "model_config": {"hidden_size": 7168, "num_hidden_layers": 61},
    }
    merged = merge_e2e.merge(committed, [("run90", shallow), ("run91", deep)])
    assert [r["run"] for r in merged["records"][len(committed["records"]) :]] == ["run90", "run91"]
    assert merged["models"]["rank-61-layers"]["num_hidden_layers"] == 61
    assert merged["models"]["rank"] == {"preset": "rank", "seed": 0, "hidden_size": 7168}
