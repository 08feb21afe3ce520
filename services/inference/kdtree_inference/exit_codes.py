"""The exit statuses of the inference package's programs (``kdtree-serve``, ``kdtree-engine``,
``kdtree-selfcheck``, the engine's demo and GPU tools), in one place.

The parity package keeps its own (``kdtree_parity.exit_codes``): the two packages ship in separate
images and neither depends on the other.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a self-check case failed, or the engine failed to start
    REFUSED = 2  # bad configuration or arguments: nothing was started
    CANNOT_EXECUTE = 127  # the server program could not be executed (the shell's convention)
    INTERRUPTED = 130  # stopped by Ctrl-C (the shell's 128 + SIGINT)
