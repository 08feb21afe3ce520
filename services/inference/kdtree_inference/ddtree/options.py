"""DDTree's knobs: the candidates per depth, the tree search's implementation, and
``kdtree-serve``'s DDTree flags.

SGLang 0.5.23 has no DDTree flags of its own, and a plugin cannot add arguments to its parser, so
the tree's size rides on SGLang's ``--speculative-num-draft-tokens`` (the verify width, budget + 1)
and the candidates per depth on ``KDTREE_DDTREE_TOPK``. ``kdtree-serve`` also takes the flags a
DDTree operator expects and rewrites them into those two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TOPK_ENV = "KDTREE_DDTREE_TOPK"
BUDGET_FLAG = "--speculative-ddtree-budget"
TOPK_FLAG = "--speculative-ddtree-topk"
WIDTH_FLAG = "--speculative-num-draft-tokens"


class DDTreeFlagError(ValueError):
    """A DDTree flag with a value it cannot take."""


def ddtree_topk(env: Mapping[str, str]) -> int:
    """Candidates per depth: ``KDTREE_DDTREE_TOPK`` (``InferenceSettings.ddtree_topk``)."""
    from ..settings import InferenceSettings

    return InferenceSettings.from_env(env).ddtree_topk


def ddtree_search(env: Mapping[str, str]) -> str:
    """The tree search's implementation: ``KDTREE_DDTREE_SEARCH``
    (``InferenceSettings.ddtree_search``), ``torch`` or ``triton``."""
    from ..settings import InferenceSettings

    return InferenceSettings.from_env(env).ddtree_search


def _positive(raw: str, name: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise DDTreeFlagError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise DDTreeFlagError(f"{name}={value}: it must be at least 1")
    return value


def _take(args: list[str], flag: str) -> tuple[list[str], str | None]:
    """``args`` without ``flag`` (``--flag v`` or ``--flag=v``), and its last value."""
    kept, value, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg == flag:
            if i + 1 >= len(args):
                raise DDTreeFlagError(f"{flag} needs a value")
            value, i = args[i + 1], i + 2
            continue
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        else:
            kept.append(arg)
        i += 1
    return kept, value


def rewrite_ddtree_flags(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """SGLang's arguments for ``args``, and the environment DDTree's worker reads.

    ``--speculative-ddtree-budget N`` becomes ``--speculative-num-draft-tokens N+1`` (refused when
    both are given and disagree); ``--speculative-ddtree-topk K`` becomes ``KDTREE_DDTREE_TOPK``.
    """
    rest, budget = _take(list(args), BUDGET_FLAG)
    rest, top_k = _take(rest, TOPK_FLAG)
    env: dict[str, str] = {}
    if top_k is not None:
        env[TOPK_ENV] = str(_positive(top_k, TOPK_FLAG))
    if budget is not None:
        width = _positive(budget, BUDGET_FLAG) + 1
        given = [a.split("=", 1)[1] for a in rest if a.startswith(WIDTH_FLAG + "=")]
        given += [rest[i + 1] for i, a in enumerate(rest[:-1]) if a == WIDTH_FLAG]
        if any(value != str(width) for value in given):
            raise DDTreeFlagError(
                f"{BUDGET_FLAG} {budget} means {WIDTH_FLAG} {width} (the tree and its root), "
                f"but {WIDTH_FLAG} {given[-1]} is given too: keep one of them"
            )
        if not given:
            rest += [WIDTH_FLAG, str(width)]
    return rest, env
