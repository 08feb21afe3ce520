"""The exit statuses of the gate's programs (``kdtree-parity``, ``make promote``), in one place.

CI and ``make promote`` read them: 0 passed, 1 the candidate was refused, 2 the gate could not
decide (bad input, an unreachable target, an interrupted run).
"""

from enum import IntEnum


class ExitCode(IntEnum):
    PASSED = 0
    FAILED = 1
    ERROR = 2
