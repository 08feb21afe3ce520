"""``KDTREE_START_GATE`` holds SGLang's real scheduler start (``run_scheduler_process``, spawned as
SGLang spawns it) in the plugin until the gate file exists, and no other process that loads the
plugins: the launcher goes on at once."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from spawned_python import clean_env

SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys

    if __name__ == "__main__":
        from sglang.srt.plugins import load_plugins

        load_plugins()  # the launcher's own call: no wait, whatever the gate
        print("launcher went on", file=sys.stderr, flush=True)
        from sglang.srt.managers.scheduler import run_scheduler_process

        # Placeholder arguments: the start is held in load_plugins(), its first call; once the
        # gate opens it goes on and fails on them, which is all this test needs of it.
        child = mp.get_context("spawn").Process(
            target=run_scheduler_process, args=(None, None, 0, 0, 0, None, None)
        )
        child.start()
        child.join(240)
        print(f"scheduler exited {child.exitcode}", file=sys.stderr, flush=True)
    """
)


def read_until(stream, text: str, deadline: float) -> list[str]:
    """Lines of ``stream`` up to and including the first that contains ``text``."""
    lines = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no {text!r} in:\n{''.join(lines)[-3000:]}")


def test_the_gate_holds_the_scheduler_start_and_not_the_launcher(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = tmp_path / "start.py"
    script.write_text(SCRIPT)
    env = clean_env(KDTREE_START_GATE=str(gate), KDTREE_START_GATE_TIMEOUT_S="200")
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 240
        before = read_until(proc.stderr, "waiting for the start gate", deadline)
        assert any("launcher went on" in line for line in before)
        assert f"waiting for the start gate {gate}" in before[-1]
        assert sum("waiting for the start gate" in line for line in before) == 1
        # Held: two seconds on, the scheduler has neither gone on nor exited.
        time.sleep(2.0)
        assert proc.poll() is None
        gate.touch()
        after = read_until(proc.stderr, "scheduler exited", deadline)
        opened = [line for line in after if "opened after" in line]
        assert len(opened) == 1 and f"the start gate {gate} opened after" in opened[0]
        waited = float(opened[0].rsplit("after ", 1)[1].split(" s")[0])
        assert waited >= 2.0
        # It went on past the gate into SGLang's start, which the placeholders then fail.
        assert after.index(opened[0]) < len(after) - 1
        assert "scheduler exited 0" not in after[-1]
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
