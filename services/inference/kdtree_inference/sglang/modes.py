"""The backend's settings, read from the environment once, when the backend is constructed.

=========================== ========= ===============================================================
variable                    default   meaning
=========================== ========= ===============================================================
KDTREE_VERIFY               off       off: stock SGLang; validate: run both, serve Triton, measure the
                                      difference; on: serve the kdtree kernel
KDTREE_VALIDATE_EVERY       100       publish the comparison statistics every N verify steps
KDTREE_SHADOW_EVERY         0         on mode: also run Triton and compare on every Nth verify step
                                      (0 = never)
KDTREE_VERIFY_ATOL          by pool   an element is over tolerance when |kernel - triton| >
                                      atol + rtol * |triton|; atol 0.02 on a bf16 pool, 0.125
                                      on an fp8 pool (one e4m3 step of an attention weight)
KDTREE_VERIFY_RTOL          0.02
KDTREE_SHADOW_ERROR_STREAK  3         on mode: this many consecutive published windows over
                                      tolerance log an error and count one shadow error
KDTREE_DRAFT_EXTEND         on        on: EAGLE's draft-extend forward follows KDTREE_VERIFY too
                                      (it is the same attention, causal); off: it stays on Triton
KDTREE_FP8_NUMERICS         triton    fp8 KV pool: triton rounds q and P to e4m3 as SGLang's Triton
                                      path does (parity with stock); fp16 keeps them in fp16
                                      (closer to the exact result on the stored values)
KDTREE_INJECT_FAULT         (unset)   TEST ONLY, needs KDTREE_VERIFY=on: a graded fault in the kernel's
                                      verify attention (scale:S, kv_drop:P, tree_mask:R;
                                      kdtree_inference.faults), for measuring the parity gate
=========================== ========= ===============================================================
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

from kdtree_verify.validation import FP8_NUMERICS

from ..faults import ENV_VAR as FAULT_ENV_VAR
from ..faults import Fault, FaultSpecError, parse_fault


class VerifyMode(enum.Enum):
    OFF = "off"
    VALIDATE = "validate"
    ON = "on"


class SettingsError(ValueError):
    """An environment variable holds a value the backend cannot use; the message names it."""


def _read_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected an integer >= {minimum}") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r}: expected an integer >= {minimum}")
    return value


def _read_float(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a non-negative number") from None
    if not value >= 0.0:  # also rejects nan
        raise SettingsError(f"{name}={raw!r}: expected a non-negative number")
    return value


def _read_switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in ("on", "off"):
        raise SettingsError(f"{name}={env[name]!r}: expected on or off")
    return raw == "on"


def _read_choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in choices:
        raise SettingsError(f"{name}={env[name]!r}: expected one of {'|'.join(choices)}")
    return raw


def _read_fault(env: Mapping[str, str], mode: VerifyMode) -> Fault | None:
    try:
        fault = parse_fault(env.get(FAULT_ENV_VAR))
    except FaultSpecError as exc:
        raise SettingsError(str(exc)) from None
    if fault is None:
        return None
    if mode is not VerifyMode.ON:
        raise SettingsError(
            f"{FAULT_ENV_VAR}={env[FAULT_ENV_VAR]!r} applies to the kdtree kernel's verify "
            f"attention only: it needs KDTREE_VERIFY=on, not {mode.value}"
        )
    if fault.kind == "weight":
        raise SettingsError(
            f"{FAULT_ENV_VAR}={env[FAULT_ENV_VAR]!r}: weight faults are not injected into SGLang; "
            "write a perturbed model with bench/models/make_model.py --perturb LAYER:SIZE"
        )
    return fault


def parse_mode(raw: str | None) -> VerifyMode:
    """KDTREE_VERIFY's value (case-insensitive, empty = off) as a :class:`VerifyMode`."""
    value = (raw or "").strip().lower() or VerifyMode.OFF.value
    try:
        return VerifyMode(value)
    except ValueError:
        allowed = "|".join(m.value for m in VerifyMode)
        raise SettingsError(f"KDTREE_VERIFY={raw!r}: expected one of {allowed}") from None


BF16_POOL_ATOL = 0.02
"""One bf16 step of an O(1) attention output, and some room: the kernel and Triton differ there."""

FP8_POOL_ATOL = 0.125
"""With an fp8 pool both sides round P to e4m3 (fp8_numerics="triton"); a weight whose fp32 score
sums in another order lands on the other side of a rounding boundary and moves the output by one
e4m3 step of that weight (2^-4 below 1) times its value row (|v| up to about 2 here)."""


@dataclass(frozen=True)
class VerifySettings:
    mode: VerifyMode = VerifyMode.OFF
    validate_every: int = 100
    shadow_every: int = 0
    atol: float | None = None  # None: by the KV pool's dtype (resolved_for_pool)
    rtol: float = 0.02
    shadow_error_streak: int = 3
    draft_extend: bool = True
    fp8_numerics: str = "triton"
    fault: Fault | None = None  # TEST ONLY: KDTREE_INJECT_FAULT

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
        env = os.environ if env is None else env
        mode = parse_mode(env.get("KDTREE_VERIFY"))
        return cls(
            mode=mode,
            validate_every=_read_int(env, "KDTREE_VALIDATE_EVERY", cls.validate_every, 1),
            shadow_every=_read_int(env, "KDTREE_SHADOW_EVERY", cls.shadow_every, 0),
            atol=_read_float(env, "KDTREE_VERIFY_ATOL", cls.atol),
            rtol=_read_float(env, "KDTREE_VERIFY_RTOL", cls.rtol),
            shadow_error_streak=_read_int(
                env, "KDTREE_SHADOW_ERROR_STREAK", cls.shadow_error_streak, 1
            ),
            draft_extend=_read_switch(env, "KDTREE_DRAFT_EXTEND", cls.draft_extend),
            fp8_numerics=_read_choice(env, "KDTREE_FP8_NUMERICS", cls.fp8_numerics, FP8_NUMERICS),
            fault=_read_fault(env, mode),
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
