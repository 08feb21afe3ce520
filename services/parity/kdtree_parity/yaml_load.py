"""YAML the way the parity gate reads it: safe, and a key given twice in a mapping is an error.

PyYAML keeps the last of two equal keys, so ``max_hard_divergences: 0`` followed by
``max_hard_divergences: 100`` would silently run with 100, and a second ``gate:`` section would
replace the first. Every YAML file of the parity package goes through ``load_yaml``.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: SafeLoader's own check names it
            if earlier is not key_node:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first on line {earlier.start_mark.line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """Parse one YAML document safely; raises ``yaml.YAMLError`` (duplicate keys included)."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def compose_yaml(text: str) -> yaml.Node | None:
    """The node tree of one document (for line numbers), with the same loader."""
    return yaml.compose(text, Loader=UniqueKeyLoader)
