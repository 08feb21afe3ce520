"""``python -m kdtree_parity.promote {promote,gate,rollback}``: flags over KDTREE_* settings.

Exit statuses (``ExitCode``): 0 promoted, already stable, rolled back or gate passed; 1 the gate
failed; 2 the gate could not decide or anything else went wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kdtree_settings import SettingsError

from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.promote.docker import Docker
from kdtree_parity.promote.errors import GateRefused, PromotionError
from kdtree_parity.promote.flow import (
    PromotionOptions,
    build_images,
    git_revision,
    promote,
    rollback,
    run_gate,
)
from kdtree_parity.promote.profiles import GATE_PROFILES
from kdtree_parity.promote.progress import step
from kdtree_parity.promote.settings import PromoteSettings
from kdtree_parity.untrusted_text import printable
from kdtree_parity.version import add_version_flag

Command = Callable[[argparse.Namespace, Docker], int]


def _from_env(name: str, flag_value: str = "") -> str:
    """A flag's help: the setting's description and the variable that sets it."""
    description = PromoteSettings.model_fields[name].description
    return f"{description} [KDTREE_{name.upper()}{flag_value}]"


def _selection_flags(settings: PromoteSettings) -> argparse.ArgumentParser:
    """Which image and which gate services: every command's."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--gate-profile",
        choices=sorted(GATE_PROFILES),
        default=settings.gate_profile,
        help=_from_env("gate_profile"),
    )
    flags.add_argument("--image", default=settings.image, help=_from_env("image"))
    return flags


def _record_flags(settings: PromoteSettings) -> argparse.ArgumentParser:
    """Where the records are and whether tags are pushed: promote's and rollback's."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--records",
        type=Path,
        default=settings.promotions_dir,
        help=_from_env("promotions_dir"),
    )
    flags.add_argument(
        "--push", action="store_true", default=settings.push, help=_from_env("push", "=1")
    )
    return flags


def _gate_flags(settings: PromoteSettings) -> argparse.ArgumentParser:
    """How the candidate is built and gated: promote's and gate's."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--parity-image", default=settings.parity_image_repo, help=_from_env("parity_image_repo")
    )
    flags.add_argument("--revision", help="candidate tag (default: the git revision)")
    flags.add_argument(
        "--baseline-image",
        default=settings.gate_baseline_image,
        help=_from_env("gate_baseline_image"),
    )
    flags.add_argument("--compose-file", type=Path, default=Path("compose.yaml"))
    flags.add_argument("--context", type=Path, default=Path("."), help="docker build context")
    flags.add_argument(
        "--reports", type=Path, default=settings.reports_dir, help=_from_env("reports_dir")
    )
    flags.add_argument(
        "--no-build",
        dest="build",
        action="store_false",
        help="gate images already built and tagged with --revision",
    )
    flags.add_argument("--cuda-archs", default=settings.cuda_archs, help=_from_env("cuda_archs"))
    flags.add_argument(
        "--health-timeout",
        type=int,
        default=settings.health_timeout,
        help=_from_env("health_timeout"),
    )
    flags.add_argument("--keep-up", action="store_true", help="leave the services running")
    flags.add_argument(
        "--floor",
        action="store_true",
        default=settings.gate_floor,
        help=_from_env("gate_floor", "=1"),
    )
    flags.add_argument(
        "--allow-dirty",
        action="store_true",
        help="build even though tracked files have uncommitted changes",
    )
    return flags


def _options(args: argparse.Namespace) -> tuple[PromotionOptions, bool]:
    """The run's options and whether the source tree was dirty."""
    revision, dirty = (args.revision, False) if args.revision else git_revision(args.context)
    if dirty and args.build:
        if not args.allow_dirty:
            raise PromotionError(
                f"the work tree has uncommitted changes, so the image would not be what {revision} "
                "names: commit them, or pass --allow-dirty (the record then says dirty: true)"
            )
        step(f"warning: building with uncommitted changes; {revision} does not name them")
    options = PromotionOptions(
        image=args.image,
        parity_image=args.parity_image,
        revision=revision,
        compose_file=args.compose_file,
        records_dir=getattr(args, "records", Path("promotions")),
        reports_dir=args.reports,
        context_dir=args.context,
        baseline_image=args.baseline_image,
        build=args.build,
        push=getattr(args, "push", False),
        cuda_archs=args.cuda_archs,
        health_timeout_s=args.health_timeout,
        keep_up=args.keep_up,
        gate_profile=args.gate_profile,
        floor=args.floor,
    )
    return options, dirty


def _run_promote(args: argparse.Namespace, docker: Docker) -> int:
    options, dirty = _options(args)
    path = promote(options, docker, source_dirty=dirty)
    print("already stable: nothing promoted" if path is None else f"promoted: record {path}")
    return ExitCode.PASSED


def _run_gate(args: argparse.Namespace, docker: Docker) -> int:
    options, _ = _options(args)
    if options.build:
        build_images(options, docker)
    result = run_gate(options, docker, run_id=args.run_id).result
    print(f"gate {result.verdict}: report {result.report_path.parent}")
    for reason in result.reasons:
        print(f"  - {printable(reason)}")  # one line each, whatever a target put in it
    return result.exit_code


def _run_rollback(args: argparse.Namespace, docker: Docker) -> int:
    path = rollback(args.records, args.image, docker, push=args.push, reason=args.reason)
    print(f"rolled back: record {path}")
    return ExitCode.PASSED


def build_parser(settings: PromoteSettings | None = None) -> argparse.ArgumentParser:
    settings = settings or PromoteSettings.from_env()
    parser = argparse.ArgumentParser(
        prog="python -m kdtree_parity.promote",
        description="Gate an inference image with the parity sidecar and promote it to stable.",
    )
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    selection, records, gating = (
        _selection_flags(settings),
        _record_flags(settings),
        _gate_flags(settings),
    )

    def command(name: str, help_text: str, run: Command, *parents: argparse.ArgumentParser):
        parsed = sub.add_parser(name, help=help_text, description=help_text, parents=parents)
        parsed.set_defaults(run=run)
        return parsed

    command(
        "promote",
        "build, gate, and on a pass tag the digest stable and write a record",
        _run_promote,
        selection,
        records,
        gating,
    )
    gate = command(
        "gate",
        "build and gate only (pull requests): exit 0 pass, 1 fail, 2 error; tags nothing",
        _run_gate,
        selection,
        gating,
    )
    gate.add_argument("--run-id", help="report directory name under --reports")
    rollback_command = command(
        "rollback",
        "point stable back at the previously promoted digest and record it",
        _run_rollback,
        selection,
        records,
    )
    rollback_command.add_argument("--reason", default="", help="why (kept in the record)")
    return parser


def _print_refusal(verdict: str, reasons: Sequence[str]) -> None:
    print(f"NOT PROMOTED: the parity gate said {verdict}", file=sys.stderr)
    for reason in reasons:
        print(f"  - {printable(reason)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = PromoteSettings.from_env()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    args = build_parser(settings).parse_args(argv)
    args.image = args.image or GATE_PROFILES[args.gate_profile].default_image
    try:
        return args.run(args, Docker())
    except GateRefused as refused:
        _print_refusal(refused.verdict, refused.reasons)
        return ExitCode.FAILED if refused.verdict == "fail" else ExitCode.ERROR
    except PromotionError as exc:
        print(f"{'NOT PROMOTED' if args.command == 'promote' else 'error'}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
