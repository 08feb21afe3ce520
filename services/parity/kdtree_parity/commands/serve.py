"""``kdtree-parity serve``: the HTTP service (``kdtree_parity.service``), configured from the
environment."""

from __future__ import annotations

import argparse

from kdtree_parity.commands.options import console
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.settings import ParitySettings
from kdtree_parity.untrusted_text import for_terminal

HELP = "run the HTTP service (configuration from the environment)"


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    parser.set_defaults(settings=settings)


def run(args: argparse.Namespace) -> int:
    import uvicorn  # the service's imports are only paid for by `serve`

    from kdtree_parity.logs import log_config
    from kdtree_parity.service import ConfigurationError, ServiceSettings, create_app

    try:
        app = create_app(ServiceSettings.from_settings(args.settings))
    except ConfigurationError as exc:
        console.print(
            f"[red]kdtree-parity serve: {for_terminal(exc, keep_newlines=True)}", highlight=False
        )
        return ExitCode.ERROR
    # Idle connections are kept well past clients' pool expiry (httpx: 5 s, uvicorn's default
    # too), so a client never reuses a connection the service is closing at that moment.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=log_config(),  # JSON lines, run events included (kdtree_parity.logs)
        log_level="info",
        timeout_keep_alive=75,
    )
    return ExitCode.PASSED
