"""YAML the way the parity gate reads it: YAML 1.2 (ruamel.yaml's safe loader), and a key given
twice in a mapping is an error.

YAML 1.1 (PyYAML) reads ``on``/``no`` as booleans, ``020`` as octal 16 and ``1:00`` as the
sexagesimal 60: a policy would run with values other than the ones it shows. Under YAML 1.2's
core schema ``on`` and ``1:00`` are strings (which the policy's strict types then refuse) and
``020`` is 20. A second ``max_hard_divergences:`` or ``gate:`` would silently replace the first;
it is refused with both lines named. Every YAML file of the parity package goes through
``load_yaml``.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, SequenceNode

__all__ = ["MappingNode", "Node", "YAMLError", "compose_yaml", "load_yaml"]


class DuplicateKey(MarkedYAMLError):
    """A mapping holds the same key twice."""


def _yaml() -> YAML:
    return YAML(typ="safe", pure=True)


def _refuse_duplicate_keys(node: Node | None) -> None:
    if isinstance(node, MappingNode):
        first: dict[Any, Node] = {}
        for key_node, value_node in node.value:
            key = getattr(key_node, "value", None)
            if isinstance(key, str):
                earlier = first.setdefault(key, key_node)
                if earlier is not key_node:
                    raise DuplicateKey(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key {key!r} (first on line {earlier.start_mark.line + 1})",
                        key_node.start_mark,
                    )
            _refuse_duplicate_keys(value_node)
    elif isinstance(node, SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item)


def compose_yaml(text: str) -> Node | None:
    """The node tree of one document (for line numbers); raises ``YAMLError``, a duplicate key
    included."""
    root = _yaml().compose(text)
    _refuse_duplicate_keys(root)
    return root


def load_yaml(text: str) -> Any:
    """Parse one YAML 1.2 document safely; raises ``YAMLError`` (duplicate keys included)."""
    compose_yaml(text)
    return _yaml().load(text)
