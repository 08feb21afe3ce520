"""The backend's settings, read from the environment once, when the backend is constructed.

The variables, their defaults and their meaning are :class:`kdtree_inference.settings.
InferenceSettings`' fields (README.md's configuration table lists them); this module turns them
into what the backend uses, with the rules that span variables (a fault needs ``on``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass

from ..faults import ENV_VAR as FAULT_ENV_VAR
from ..faults import Fault
from ..settings import InferenceSettings, SettingsError, VerifyMode

__all__ = ["SettingsError", "VerifyMode", "VerifySettings"]

_DEFAULTS = InferenceSettings.model_fields


def _checked_fault(fault: Fault | None, mode: VerifyMode) -> Fault | None:
    """The fault the backend injects, or a refusal of one it cannot inject in ``mode``."""
    if fault is None:
        return None
    if mode is not VerifyMode.ON:
        raise SettingsError(
            f"{FAULT_ENV_VAR}={fault.describe()!r} applies to the kdtree kernel's verify "
            f"attention only: it needs KDTREE_VERIFY=on, not {mode.value}"
        )
    if fault.kind == "weight":
        raise SettingsError(
            f"{FAULT_ENV_VAR}={fault.describe()!r}: weight faults are not injected into SGLang; "
            "write a perturbed model with bench/kdtree_bench/models/make_model.py --perturb LAYER:SIZE"
        )
    return fault


BF16_POOL_ATOL = 0.02
"""One bf16 step of an O(1) attention output, and some room: the kernel and Triton differ there."""

FP8_POOL_ATOL = 0.125
"""With an fp8 pool both sides round P to e4m3 (fp8_numerics="triton"); a weight whose fp32 score
sums in another order lands on the other side of a rounding boundary and moves the output by one
e4m3 step of that weight (2^-4 below 1) times its value row (|v| up to about 2 here)."""


class Role(enum.StrEnum):
    """The forward a backend serves: the target's tree verify, or EAGLE's draft extend (in the
    draft worker)."""

    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"

    @property
    def metric_prefix(self) -> str:
        """The prefix of this role's metric names."""
        return "kdtree_verify" if self is Role.TARGET_VERIFY else "kdtree_draft_extend"


@dataclass(frozen=True)
class VerifySettings:
    """What the backend runs, from :class:`InferenceSettings` (whose defaults these are)."""

    mode: VerifyMode = _DEFAULTS["verify"].default
    validate_every: int = _DEFAULTS["validate_every"].default
    shadow_every: int = _DEFAULTS["shadow_every"].default
    atol: float | None = _DEFAULTS["verify_atol"].default  # None: by the pool (resolved_for_pool)
    rtol: float = _DEFAULTS["verify_rtol"].default
    shadow_error_streak: int = _DEFAULTS["shadow_error_streak"].default
    draft_extend: bool = _DEFAULTS["draft_extend"].default
    fp8_numerics: str = _DEFAULTS["fp8_numerics"].default
    fault: Fault | None = _DEFAULTS["inject_fault"].default  # TEST ONLY: KDTREE_INJECT_FAULT

    def resolved_for_pool(self, fp8_pool: bool) -> VerifySettings:
        """These settings with ``atol`` fixed: the configured one, or the pool dtype's default."""
        if self.atol is not None:
            return self
        return dataclasses.replace(self, atol=FP8_POOL_ATOL if fp8_pool else BF16_POOL_ATOL)

    @property
    def compares(self) -> bool:
        """Whether any forward of this configuration runs the Triton-vs-kernel comparison."""
        return self.mode is VerifyMode.VALIDATE or (
            self.mode is VerifyMode.ON and self.shadow_every > 0
        )

    @property
    def needs_kernel(self) -> bool:
        return self.mode is not VerifyMode.OFF

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> VerifySettings:
        """Read every setting; raise :class:`SettingsError` naming the first bad variable."""
        return cls.from_settings(InferenceSettings.from_env(env))

    @classmethod
    def from_settings(cls, settings: InferenceSettings) -> VerifySettings:
        """The backend's view of ``settings``; raise :class:`SettingsError` for a fault it cannot
        inject in the configured mode."""
        return cls(
            mode=settings.verify,
            validate_every=settings.validate_every,
            shadow_every=settings.shadow_every,
            atol=settings.verify_atol,
            rtol=settings.verify_rtol,
            shadow_error_streak=settings.shadow_error_streak,
            draft_extend=settings.draft_extend,
            fp8_numerics=settings.fp8_numerics,
            fault=_checked_fault(settings.inject_fault, settings.verify),
        )

    def describe(self) -> str:
        """One line for logs and the launcher banner."""
        parts = [f"KDTREE_VERIFY={self.mode.value}"]
        if self.compares:
            parts.append(f"publish every {self.validate_every} verify steps")
            atol = "by pool dtype" if self.atol is None else f"{self.atol:g}"
            parts.append(f"tolerance atol={atol} rtol={self.rtol:g}")
        if self.mode is VerifyMode.ON:
            parts.append(
                f"shadow every {self.shadow_every} steps" if self.shadow_every else "no shadow"
            )
        if self.mode is not VerifyMode.OFF and not self.draft_extend:
            parts.append("draft extend on Triton")
        if self.mode is not VerifyMode.OFF and self.fp8_numerics != type(self).fp8_numerics:
            parts.append(f"fp8 numerics {self.fp8_numerics}")
        if self.fault is not None:
            parts.append(f"FAULT INJECTED {FAULT_ENV_VAR}={self.fault.describe()}")
        return ", ".join(parts)
