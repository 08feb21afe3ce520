"""``python -m kdtree_inference.engine`` / ``kdtree-engine``: start the reference server."""

from __future__ import annotations

import logging
import sys

from .server import build_parser, config_from_args, serve


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"kdtree-engine: {exc}", file=sys.stderr)
        return 2
    return serve(config, args.host, args.port, args.log_level)


if __name__ == "__main__":
    sys.exit(main())
