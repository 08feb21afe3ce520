"""The two ways a promotion stops without tagging anything."""

from __future__ import annotations

from collections.abc import Sequence

from kdtree_parity.exit_codes import ExitCode


class PromotionError(Exception):
    """Something went wrong that is not the gate's verdict: nothing was tagged."""


class GateRefused(Exception):
    """The gate ran and said fail (or could not decide): nothing was tagged."""

    def __init__(self, verdict: str, reasons: Sequence[str], exit_code: ExitCode) -> None:
        super().__init__(f"parity gate verdict: {verdict}")
        self.verdict = verdict
        self.reasons = list(reasons)
        self.exit_code = exit_code
