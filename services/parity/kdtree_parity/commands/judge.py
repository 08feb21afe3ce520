"""``kdtree-parity judge RUN_ID --policy P``: decide a stored run again under another policy,
replaying nothing; the stored run and its verdict stay as they are."""

from __future__ import annotations

import argparse

from kdtree_parity.commands.options import (
    EXIT,
    Refusal,
    add_db,
    console,
    open_store_read_only,
    print_reasons,
    refusing,
)
from kdtree_parity.policy import PolicyError, load_policy
from kdtree_parity.rejudge import NotDecided, rejudge
from kdtree_parity.settings import ParitySettings
from kdtree_parity.store import VERDICT_TO_STATUS
from kdtree_parity.untrusted_text import for_terminal

HELP = (
    "decide a stored run again under another policy, replaying nothing (exit 0 pass, "
    "1 fail); the stored run and its verdict stay as they are"
)


def add_arguments(parser: argparse.ArgumentParser, settings: ParitySettings) -> None:
    parser.add_argument("run_id")
    parser.add_argument("--policy", required=True, help="YAML path or default|short")
    add_db(parser, settings)


@refusing
def run(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        raise Refusal(str(exc)) from None
    store = open_store_read_only(args.db)
    try:
        try:
            done = rejudge(store, args.run_id, policy)
        except KeyError:
            raise Refusal(f"no run {args.run_id} in {args.db}") from None
        except NotDecided as exc:
            raise Refusal(str(exc)) from None
    finally:
        store.close()
    for difference in done.replay_differences:
        console.print(
            f"[yellow]not applied (the answers are stored): {for_terminal(difference)}",
            highlight=False,
        )
    print_reasons(
        done.verdict,
        f"run {done.record.id} under {policy.source}; stored verdict under "
        f"{done.record.policy_source}: {done.record.status}",
    )
    return EXIT[VERDICT_TO_STATUS[done.verdict.status]]
