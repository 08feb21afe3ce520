"""The backend's per-forward state, held beside SGLang's ``ForwardMetadata``."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from .marshal import VerifyInputs


class Phase(enum.Enum):
    """How a verify forward runs: eagerly, captured into a CUDA graph, or as a graph's replay."""

    EAGER = "eager"
    CAPTURE = "capture"
    REPLAY = "replay"


@dataclasses.dataclass
class KdtreeForward:
    """What one verify forward adds to SGLang's metadata: the marshaled kernel inputs and, on a
    captured on-mode graph with a shadow gate, the parent's metadata with the gate's indptrs.
    Belongs to ``metadata`` (the parent's ``forward_metadata`` it was built on) only."""

    phase: Phase = Phase.EAGER
    metadata: Any = None
    inputs: VerifyInputs | None = None
    shadow_metadata: Any = None

    def inputs_for(self, metadata: Any) -> VerifyInputs | None:
        return self.inputs if metadata is not None and metadata is self.metadata else None

    def shadow_metadata_for(self, metadata: Any) -> Any:
        return self.shadow_metadata if metadata is not None and metadata is self.metadata else None
