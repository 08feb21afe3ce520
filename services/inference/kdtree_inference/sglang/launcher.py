"""``kdtree-serve``: start SGLang with the kdtree verify backend, or refuse and say why.

Every argument is passed to SGLang's launcher unchanged (``python -m sglang.launch_server ...``,
or the command in KDTREE_SGLANG_LAUNCHER, split like a shell would). Before handing over, the
launcher prints the active KDTREE_VERIFY mode and, when the mode needs the kernel (``validate``,
``on``), refuses to start (``ExitCode.REFUSED``, nothing launched) if:

- the kdtree plugin is not installed, or SGLANG_PLUGINS leaves it out (the backend would never
  be installed in the scheduler processes);
- ``--attention-backend`` / ``--decode-attention-backend`` names a backend other than triton (the
  kdtree backend replaces "triton" only);
- the CUDA kernel is missing or does not run on this GPU (checked with a real call; see
  ``extension``).

DDTree's flags (``--speculative-ddtree-budget``, ``--speculative-ddtree-topk``) are rewritten into
what SGLang and the DDTree worker read (``ddtree.options``); a bad value refuses the start.

``--help`` (``-h``) skips those checks: SGLang prints its arguments and starts nothing.
``--version`` alone prints kdtree-inference's version and the installed SGLang's.
``kdtree-serve kdtree-selfcheck [ARGS]`` runs ``kdtree-selfcheck [ARGS]`` instead (the image's
entrypoint is kdtree-serve, so ``docker run IMAGE kdtree-selfcheck`` works as typed).

The process then becomes SGLang (``exec``), so signals and the exit status are SGLang's own.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points

from ..ddtree.options import DDTreeFlagError, rewrite_ddtree_flags
from ..exit_codes import ExitCode
from ..settings import InferenceSettings
from ..version import package_version, version_line
from .modes import SettingsError, VerifyMode, VerifySettings

PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "kdtree_verify"
BACKEND_FLAGS = ("--attention-backend", "--decode-attention-backend")
SELFCHECK = "kdtree-selfcheck"
HELP_FLAGS = frozenset({"-h", "--help"})


def _say(message: str) -> None:
    print(f"kdtree-serve: {message}", file=sys.stderr, flush=True)


def launch_command(args: Sequence[str], settings: InferenceSettings) -> list[str]:
    """The exact argv kdtree-serve executes for ``args`` (KDTREE_SGLANG_LAUNCHER's command)."""
    custom = settings.sglang_launcher
    prefix = shlex.split(custom) if custom else [sys.executable, "-m", "sglang.launch_server"]
    return [*prefix, *args]


def flag_values(args: Sequence[str], flag: str) -> list[str]:
    """Values given to ``flag`` in ``args`` (both ``--flag value`` and ``--flag=value``)."""
    values = []
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


def plugin_problem(env: Mapping[str, str]) -> str | None:
    """Why SGLang would not load our plugin in its processes, or None."""
    names = {ep.name for ep in entry_points(group=PLUGIN_GROUP)}
    if PLUGIN_NAME not in names:
        return (
            f"the {PLUGIN_NAME!r} entry point ({PLUGIN_GROUP}) is not installed; install the "
            "kdtree-inference package (pip install kdtree-inference) in this environment"
        )
    allowed = env.get("SGLANG_PLUGINS", "").strip()
    if allowed and PLUGIN_NAME not in {name.strip() for name in allowed.split(",")}:
        return f"SGLANG_PLUGINS={allowed!r} does not include {PLUGIN_NAME!r}"
    return None


def backend_problem(args: Sequence[str]) -> str | None:
    for flag in BACKEND_FLAGS:
        for value in flag_values(args, flag):
            if value != "triton":
                return (
                    f"{flag} {value}: the kdtree kernel replaces SGLang's 'triton' attention "
                    f"backend only; use {flag} triton"
                )
    return None


def kernel_problem() -> str | None:
    from .extension import cuda_extension_status

    status = cuda_extension_status()
    return None if status.usable else status.detail


def preflight(
    settings: VerifySettings,
    args: Sequence[str],
    env: Mapping[str, str],
    check_kernel: Callable[[], str | None] = kernel_problem,
) -> list[str]:
    """Every reason to refuse starting (empty: go)."""
    if settings.mode is VerifyMode.OFF:
        return []
    problems = [p for p in (plugin_problem(env), backend_problem(args)) if p]
    kernel = check_kernel()
    if kernel:
        problems.append(kernel)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        # Ours and the SGLang it launches; nothing is started.
        print(f"{version_line('kdtree-serve')} (sglang {package_version('sglang')})")
        return ExitCode.OK
    if args[:1] == [SELFCHECK]:
        # The image's entrypoint is kdtree-serve: `docker run IMAGE kdtree-selfcheck ...` lands here.
        from ..selfcheck import main as selfcheck

        return selfcheck(args[1:])
    env = os.environ
    try:
        inference = InferenceSettings.from_env(env)
        settings = VerifySettings.from_settings(inference)
        args, ddtree_env = rewrite_ddtree_flags(args)
    except (SettingsError, DDTreeFlagError) as error:
        _say(f"refusing to start: {error}")
        return ExitCode.REFUSED
    env.update(ddtree_env)  # the exec'd SGLang and its schedulers inherit it
    _say(f"mode: {settings.describe()}")
    if settings.mode is not VerifyMode.OFF and not flag_values(args, "--attention-backend"):
        _say("note: pass --attention-backend triton so SGLang picks the backend kdtree replaces")
    # Help starts nothing, so it needs no kernel: SGLang prints its arguments in every mode.
    problems = [] if HELP_FLAGS & set(args) else preflight(settings, args, env)
    if problems:
        for problem in problems:
            _say(f"refusing to start with KDTREE_VERIFY={settings.mode.value}: {problem}")
        _say("set KDTREE_VERIFY=off to serve with SGLang's stock Triton kernel")
        return ExitCode.REFUSED
    command = launch_command(args, inference)
    _say(f"exec {shlex.join(command)}")
    try:
        os.execvp(command[0], command)
    except OSError as error:
        _say(f"cannot execute {command[0]!r}: {error}")
        return ExitCode.CANNOT_EXECUTE
    return ExitCode.OK  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
