"""The kernel build's environment, in the shared settings dialect (``kdtree_settings``).

``_build``, ``_ptxas`` and ``_sass`` read these through :func:`build_settings`, never
``os.environ``: a variable that is unset, empty or blank takes its default, and a bad value is
refused with :class:`BuildSettingsError` naming the variable and what it expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar

import kdtree_settings
from kdtree_settings import EnvSettings, on_off
from pydantic import BeforeValidator, Field, Strict, field_validator
from pydantic_settings import SettingsConfigDict

ARCHS_FILE = Path(__file__).resolve().parent / "cuda_archs.txt"
DEFAULT_ARCHS = ARCHS_FILE.read_text().strip()


class BuildSettingsError(kdtree_settings.SettingsError):
    """A kernel-build variable holds a value the build cannot use; the message names it."""


def parse_archs(raw: str, what: str = "KDTREE_CUDA_ARCHS") -> list[str]:
    """SM versions from a ';'- (or ',')-separated list, validated (``'80;90'`` -> ``['80', '90']``)."""
    archs = [a.strip() for a in raw.replace(",", ";").split(";") if a.strip()]
    if not archs or not all(a.isdigit() for a in archs):
        raise ValueError(
            f"{what}={raw!r}: expected SM versions separated by ';' (digits only, no 'sm_'), "
            f"e.g. {DEFAULT_ARCHS!r}"
        )
    return archs


def _one_or_zero(value: Any) -> Any:
    """``1``/``0`` (the build's historical spelling) or ``on``/``off``."""
    if isinstance(value, str) and value.strip() in ("1", "0"):
        return value.strip() == "1"
    return on_off(value)


class BuildSettings(EnvSettings):
    """What the kernel build reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="", frozen=True, extra="ignore")
    error_type: ClassVar[type[kdtree_settings.SettingsError]] = BuildSettingsError

    cuda_archs: str = Field(
        DEFAULT_ARCHS,
        validation_alias="KDTREE_CUDA_ARCHS",
        description="SM versions the CUDA extension is compiled for, ';'-separated; the "
        "default is kernel/kdtree_verify/cuda_archs.txt, the one list, which make passes to the "
        "image builds",
    )
    build_dir: Path | None = Field(
        None,
        validation_alias="KDTREE_BUILD_DIR",
        description="where the extension's objects and module go; unset: "
        "`kernel/build/torch<version>` in a checkout, "
        "`$XDG_CACHE_HOME/kdtree-verify/torch<version>` for an installed package",
    )
    build_without_gpu: Annotated[bool, Strict(), BeforeValidator(_one_or_zero)] = Field(
        False,
        validation_alias="KDTREE_BUILD_WITHOUT_GPU",
        description="`1` (or `on`) lets `make kernel` compile on a machine without a GPU",
    )
    xdg_cache_home: Path | None = Field(
        None,
        validation_alias="XDG_CACHE_HOME",
        description="the user's cache directory (unset: `~/.cache`), under which an installed "
        "package builds",
    )
    cuda_home: Path | None = Field(
        None,
        validation_alias="CUDA_HOME",
        description="the CUDA toolkit, where `make ptxas` and `make sass` look for nvcc and "
        "cuobjdump that PATH lacks",
    )

    @field_validator("cuda_archs")
    @classmethod
    def _archs(cls, raw: str) -> str:
        parse_archs(raw)
        return raw

    @property
    def archs(self) -> list[str]:
        """The SM versions (e.g. ``['80', '90', '120']``)."""
        return parse_archs(self.cuda_archs)

    @property
    def cache_home(self) -> Path:
        return self.xdg_cache_home or Path.home() / ".cache"


def build_settings(env: Mapping[str, str] | None = None) -> BuildSettings:
    """The build settings from the environment (or ``env`` alone), read now."""
    return BuildSettings.from_env(env)
