"""The compose services that play baseline, candidate and sidecar in a gate run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GateProfileName = Literal["gate", "demo"]


@dataclass(frozen=True)
class GateProfile:
    """Which compose services play baseline, candidate and sidecar, and the variables that pick
    their images. ``demo`` runs the same promotion with the CPU reference engine standing in for
    the inference image, so the whole path runs on a machine without a GPU."""

    servers: tuple[str, str]
    sidecar: str
    baseline_var: str
    candidate_var: str
    build_target: str
    default_image: str
    # The optional A/A' floor (``--floor``): its compose service and profile, and the variable
    # naming its image (the baseline's: the same model computed an equivalent way).
    floor_server: str = ""
    floor_profile: str = ""
    floor_var: str = ""


GATE_PROFILES: dict[GateProfileName, GateProfile] = {
    "gate": GateProfile(
        servers=("inference-baseline", "inference-candidate"),
        sidecar="parity",
        baseline_var="KDTREE_BASELINE_IMAGE",
        candidate_var="KDTREE_CANDIDATE_IMAGE",
        build_target="inference",
        default_image="kdtree/inference",
        floor_server="inference-floor",
        floor_profile="floor",
        floor_var="KDTREE_FLOOR_IMAGE",
    ),
    "demo": GateProfile(
        servers=("demo-baseline", "demo-candidate"),
        sidecar="demo-parity",
        baseline_var="KDTREE_DEMO_BASELINE_IMAGE",
        candidate_var="KDTREE_DEMO_CANDIDATE_IMAGE",
        build_target="demo",
        default_image="kdtree/demo",
        floor_server="demo-floor",
        floor_profile="demo-floor",
        floor_var="KDTREE_DEMO_BASELINE_IMAGE",
    ),
}
