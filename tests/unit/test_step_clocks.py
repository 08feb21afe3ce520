"""bench/kdtree_bench/profiling/step_clocks.py: a speed run's repetitions lined up with nvidia-smi's clock log."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from kdtree_bench.profiling import step_clocks

# As the speed phase's nvidia-smi writes it (the H200, e2e 24), a message line mixed in.
HEADER = (
    "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
    "utilization.gpu [%], temperature.gpu, clocks_event_reasons.active"
)
ROWS = [
    ("2026/12/03 14:27:59.400", 1980, 123.2, 40, "0x0000000000000000"),
    ("2026/12/03 14:27:59.600", 1980, 250.0, 80, "0x0000000000000000"),
    ("2026/12/03 14:27:59.800", 1410, 240.0, 70, "0x0000000000000004"),
    ("2026/12/03 14:28:00.000", 1500, 200.0, 60, "0x0000000000000001"),
    ("2026/12/03 14:28:00.200", 1980, 130.0, 10, "0x0000000000000000"),
]


def unix(text: str) -> float:
    return datetime.strptime(text, step_clocks.TIME_FORMAT).timestamp()


def write_log(path: Path) -> Path:
    lines = [HEADER, "Failed to query something: [N/A]"]
    lines += [f"{t}, {sm}, 3201, {w}, {u}, 42, {r}" for t, sm, w, u, r in ROWS]
    path.write_text("\n".join(lines) + "\n")
    return path


def speed_json(path: Path) -> Path:
    def record(configuration: str, samples: list[dict]) -> dict:
        return {"configuration": configuration, "batch": 1, "prompt_len": 1024, "samples": samples}

    on = [  # a slow repetition over three samples, then one too short to hold any
        {
            "started_at": unix(ROWS[1][0]) - 0.05,
            "wall_s": 0.5,
            "step_ms": 7.2,
            "host_busy_cpus": 9.5,
        },
        {"started_at": unix(ROWS[4][0]) + 0.01, "wall_s": 0.05, "step_ms": 4.6},
    ]
    off = [{"started_at": unix(ROWS[0][0]) - 0.01, "wall_s": 0.05, "step_ms": 4.5}]
    old = [{"wall_s": 0.4, "step_ms": 4.5}]  # written before repetitions carried a start
    records = [record("on", on), record("off", off), record("old", old)]
    path.write_text(json.dumps({"records": records}))
    return path


def test_each_repetition_gets_the_clock_samples_inside_its_wall_time(tmp_path) -> None:
    clocks = step_clocks.read_clocks(write_log(tmp_path / "gpu_clocks.csv"))
    assert len(clocks) == len(ROWS)
    speed = json.loads(speed_json(tmp_path / "speed.json").read_text())
    rows = [step_clocks.during(rep, clocks) for rep in step_clocks.repetitions(speed)]
    # In time order; the repetition without started_at is left out.
    assert [(r["configuration"], r["repetition"]) for r in rows] == [
        ("off", 0),
        ("on", 0),
        ("on", 1),
    ]
    off, slow, short = rows
    assert off["samples"] == 1 and off["sm_mhz_median"] == 1980 and off["throttle"] == "0x0"
    assert slow["samples"] == 3
    assert (slow["sm_mhz_median"], slow["sm_mhz_min"]) == (1500, 1410)
    assert slow["power_w_mean"] == 230.0 and slow["utilization_pct_mean"] == 70.0
    assert slow["throttle"] == "0x5"  # the reasons seen during it, together
    assert short["samples"] == 0 and short["sm_mhz_median"] is None


def test_the_cli_prints_and_writes_the_table(tmp_path, capsys) -> None:
    out = tmp_path / "step_clocks.md"
    code = step_clocks.main(
        [
            str(speed_json(tmp_path / "speed.json")),
            str(write_log(tmp_path / "gpu_clocks.csv")),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text()
    assert "| on | 1x1024 | 0 | 7.2 | 9.5 | 3 | 1500 (1410) | 230.0 | 70.0 | 0x5 |" in printed
    # A repetition from before the host's load was recorded, and one too short for a sample.
    assert "| on | 1x1024 | 1 | 4.6 | - | 0 | - | - | - | - |" in printed


def test_a_log_without_samples_or_a_run_without_starts_is_refused(tmp_path, capsys) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER + "\n")
    speed = speed_json(tmp_path / "speed.json")
    assert step_clocks.main([str(speed), str(empty)]) == 2
    assert "no clock samples" in capsys.readouterr().err
    no_starts = tmp_path / "old.json"
    no_starts.write_text(json.dumps({"records": [{"configuration": "off", "samples": [{}]}]}))
    assert step_clocks.main([str(no_starts), str(write_log(tmp_path / "c.csv"))]) == 2
    assert "no repetition with started_at" in capsys.readouterr().err
