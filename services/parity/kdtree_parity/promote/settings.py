"""promote's settings from the environment (``KDTREE_*``); its flags override each of them."""

from __future__ import annotations

from pathlib import Path

from kdtree_settings import EnvSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kdtree_parity.promote.errors import PromotionError
from kdtree_parity.promote.profiles import GateProfileName

# The one source of the kernel's GPU architectures; repo-relative, as promote runs from the
# checkout it builds.
CUDA_ARCHS_FILE = Path("kernel/kdtree_verify/cuda_archs.txt")


class PromoteSettings(EnvSettings):
    """Read once when promote starts (``from_env``); a bad variable is refused in the shared
    dialect, one line each."""

    model_config = SettingsConfigDict(env_prefix="KDTREE_", extra="ignore", frozen=True)

    gate_profile: GateProfileName = Field(
        "gate",
        description="compose services that gate: 'gate' (the SGLang pair on GPUs) or 'demo' "
        "(the CPU reference engine in the inference image's place: how the promotion path is "
        "proven without a GPU)",
    )
    image: str | None = Field(
        None,
        description="inference image repository to promote, tagged <revision> and stable "
        "(default: kdtree/inference, or kdtree/demo with the demo gate profile)",
    )
    promotions_dir: Path = Field(Path("promotions"), description="promotion records directory")
    push: bool = Field(
        False,
        description="also push the revision and stable tags; the registry is checked first, and "
        "if it does not answer nothing is gated or tagged",
    )
    parity_image_repo: str = Field(
        "kdtree/parity", description="parity sidecar image repository (tag <revision>)"
    )
    gate_baseline_image: str | None = Field(
        None,
        description="baseline image of the gate (default: the candidate image itself, run with "
        "KDTREE_VERIFY=off)",
    )
    reports_dir: Path = Field(Path("runs/reports"), description="where gate reports go")
    cuda_archs: str | None = Field(
        None,
        description=f"GPU architectures the inference image's kernel is built for (default: "
        f"the checkout's {CUDA_ARCHS_FILE})",
    )
    health_timeout: int = Field(1800, description="seconds to wait for both servers to be healthy")
    gate_floor: bool = Field(
        False,
        description="also start the A/A' floor server (the baseline with another KV split "
        "count) and judge the candidate by its excess over it",
    )


def checkout_cuda_archs(path: Path = CUDA_ARCHS_FILE) -> str:
    """The arch list the checkout's kernel declares (``80;90;120``)."""
    try:
        archs = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise PromotionError(
            f"cannot read the CUDA arch list {path} ({exc.strerror}): run from the checkout, "
            "or set KDTREE_CUDA_ARCHS / --cuda-archs"
        ) from exc
    if not archs:
        raise PromotionError(f"{path} is empty: it names the CUDA archs to build, e.g. 80;90;120")
    return archs
