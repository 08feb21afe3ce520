"""The kernel build's environment (``kdtree_verify._settings.BuildSettings``) in the shared
settings dialect: _build, _ptxas and _sass read it, not os.environ."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdtree_verify import _build, _ptxas, _sass
from kdtree_verify._settings import (
    DEFAULT_ARCHS,
    BuildSettings,
    BuildSettingsError,
    build_settings,
)


def test_defaults_and_blank_values() -> None:
    default = build_settings({})
    assert default.archs == DEFAULT_ARCHS.split(";")
    assert (default.build_dir, default.cuda_home, default.build_without_gpu) == (None, None, False)
    blank = {
        "KDTREE_CUDA_ARCHS": " ",
        "KDTREE_BUILD_DIR": "",
        "KDTREE_BUILD_WITHOUT_GPU": "",
        "CUDA_HOME": " ",
        "XDG_CACHE_HOME": "",
    }
    assert build_settings(blank) == default
    assert default.cache_home == Path.home() / ".cache"


def test_values_are_read() -> None:
    settings = build_settings(
        {
            "KDTREE_CUDA_ARCHS": "90, 120",
            "KDTREE_BUILD_DIR": "/tmp/b",
            "KDTREE_BUILD_WITHOUT_GPU": "1",
            "CUDA_HOME": "/opt/cuda",
            "XDG_CACHE_HOME": "/tmp/cache",
        }
    )
    assert settings.archs == ["90", "120"]
    assert settings.build_dir == Path("/tmp/b")
    assert settings.build_without_gpu is True
    assert settings.cuda_home == Path("/opt/cuda")
    assert settings.cache_home == Path("/tmp/cache")
    for raw, value in (("0", False), ("on", True), ("OFF", False)):
        assert build_settings({"KDTREE_BUILD_WITHOUT_GPU": raw}).build_without_gpu is value


def test_bad_values_name_the_variable_and_what_it_expects() -> None:
    with pytest.raises(BuildSettingsError) as refused:
        build_settings({"KDTREE_CUDA_ARCHS": "sm_90", "KDTREE_BUILD_WITHOUT_GPU": "yes"})
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("KDTREE_CUDA_ARCHS='sm_90': expected SM versions separated by ';'")
    assert lines[1] == "KDTREE_BUILD_WITHOUT_GPU='yes': expected on or off"
    assert isinstance(refused.value, ValueError)
    assert BuildSettings.env_var("cuda_home") == "CUDA_HOME"


def test_the_build_tools_read_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "90")
    assert _build.cuda_archs() == ["90"]
    monkeypatch.setenv("KDTREE_CUDA_ARCHS", "ninety")
    with pytest.raises(BuildSettingsError, match="KDTREE_CUDA_ARCHS='ninety'"):
        _build.cuda_archs()
    monkeypatch.delenv("KDTREE_CUDA_ARCHS")
    monkeypatch.setenv("KDTREE_BUILD_DIR", str(tmp_path / "out"))
    assert _build.build_dir() == tmp_path / "out"
    # CUDA_HOME: where _ptxas and _sass look when PATH has no tool
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    (tmp_path / "bin" / "cuobjdump").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert _ptxas.find_nvcc() == str(tmp_path / "bin" / "nvcc")
    assert _sass.find_cuobjdump() == str(tmp_path / "bin" / "cuobjdump")
