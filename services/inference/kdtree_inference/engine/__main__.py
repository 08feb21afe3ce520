"""``python -m kdtree_inference.engine`` / ``kdtree-engine``: start the reference server."""

from __future__ import annotations

import logging
import sys

from ..exit_codes import ExitCode
from ..settings import InferenceSettings, SettingsError
from .server import build_parser, config_from_args, serve


def _refuse(problem: Exception) -> int:
    print(f"kdtree-engine: {problem}", file=sys.stderr)
    return ExitCode.REFUSED


def main(argv: list[str] | None = None) -> int:
    try:
        settings = InferenceSettings.from_env()
    except SettingsError as exc:
        return _refuse(exc)
    args = build_parser(settings).parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args, settings)
    except ValueError as exc:
        return _refuse(exc)
    return serve(config, args.host, args.port, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
