"""kdtree-selfcheck on the GPU: every correctness case passes on this device, the benchmark times
the kernel and SGLang's Triton path per shape, and both reports say so (the command an operator
runs before any gate; in the image: docker run --gpus all kdtree/inference:TAG kdtree-selfcheck)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_selfcheck_passes_and_reports_this_device(tmp_path: Path) -> None:
    out = tmp_path / "report"
    command = [
        sys.executable,
        "-m",
        "kdtree_inference.selfcheck",
        "--out",
        str(out),
        "--quick",
        "--warmup",
        "3",
        "--repeats",
        "10",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((out / "selfcheck.json").read_text())
    major, minor = torch.cuda.get_device_capability(0)
    assert report["device"]["sm"] == f"sm_{major}{minor}"
    assert report["device"]["name"] == torch.cuda.get_device_name(0)
    from kdtree_inference.selfcheck import CASES, QUICK_SHAPES

    assert [c["name"] for c in report["cases"]] == [c.name for c in CASES]
    failed = [c for c in report["cases"] if not c["passed"]]
    assert not failed, failed
    assert report["benchmark"]["triton_unavailable"] is None, "SGLang's Triton path should import"
    shapes = report["benchmark"]["shapes"]
    assert [s["shape"] for s in shapes] == [s.name for s in QUICK_SHAPES]
    for shape in shapes:
        for contender in ("kdtree", "triton"):
            timing = shape[contender]
            assert timing["repeats"] == 10
            assert 0 < timing["min_us"] <= timing["median_us"] <= timing["max_us"]
        assert shape["speedup"] > 0
    markdown = (out / "selfcheck.md").read_text()
    assert markdown.startswith("# kdtree self-check: PASS")
    assert markdown == result.stdout, "the Markdown report also goes to stdout"


def test_a_wrong_kernel_result_fails_its_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge is real: an op that returns slightly wrong values fails the case, with the reason."""
    import kdtree_verify
    from kdtree_inference import selfcheck

    real = kdtree_verify.verify_attention

    def skewed(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out * 1.05, lse

    monkeypatch.setattr(kdtree_verify, "verify_attention", skewed)
    record = selfcheck.run_case(selfcheck.CASES[2], torch.device("cuda", 0))
    assert record["passed"] is False
    assert "exceeds the bf16 bound" in record["detail"]
