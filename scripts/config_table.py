"""README.md's configuration tables, rendered from the packages' settings models.

Each section is one pydantic-settings class; its table (variable, default, meaning: the field's
``description``) sits in README.md between the section's two marker comments. ``make
config-table`` rewrites them; ``--check`` (tests/unit/test_config_table.py) exits 1 when README.md
differs from what the models say.

    python scripts/config_table.py [--check] [--readme README.md]
"""

from __future__ import annotations

import argparse
import enum
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@dataclass(frozen=True)
class Section:
    """One generated table: its marker name and the settings class, as ``module:Class``."""

    name: str
    settings: str

    @property
    def begin(self) -> str:
        return f"<!-- config-table:{self.name} begin (make config-table writes this table) -->"

    @property
    def end(self) -> str:
        return f"<!-- config-table:{self.name} end -->"

    def load(self) -> type[BaseSettings]:
        """The settings class; imported only now, and an import error is not caught: a section
        whose model is missing fails loudly."""
        module, _, name = self.settings.partition(":")
        return getattr(importlib.import_module(module), name)


# One entry per generated table: a model added here needs its markers in README.md.
SECTIONS: tuple[Section, ...] = (
    Section("inference", "kdtree_inference.settings:InferenceSettings"),
    Section("promote", "kdtree_parity.promote.settings:PromoteSettings"),
    Section("parity", "kdtree_parity.settings:ParitySettings"),
)


def env_var(settings: type[BaseSettings], name: str, field: FieldInfo) -> str:
    """The variable that sets ``name``: its alias, else the class's prefix and the name."""
    if isinstance(field.validation_alias, str):
        return field.validation_alias
    return str(settings.model_config.get("env_prefix", "")) + name.upper()


def shown_default(value: Any) -> str:
    """A default as a user would type it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    if isinstance(value, enum.Enum):
        value = value.value
    text = str(value)
    return f"`{text}`" if text else "empty"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(settings: type[BaseSettings]) -> str:
    """The Markdown table of ``settings``' fields, in their declared order."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in settings.model_fields.items():
        if not field.description:
            raise ValueError(f"{settings.__qualname__}.{name} has no description for the table")
        variable = env_var(settings, name, field)
        rows.append(
            f"| `{variable}` | {cell(shown_default(field.default))} | {cell(field.description)} |"
        )
    return "\n".join(rows)


def rewrite(readme: str, sections: tuple[Section, ...] = SECTIONS) -> str:
    """``readme`` with every section's table regenerated between its markers."""
    for section in sections:
        pattern = re.compile(re.escape(section.begin) + r"\n.*?" + re.escape(section.end), re.S)
        found = list(pattern.finditer(readme))
        if len(found) != 1:
            raise ValueError(f"README.md needs exactly one {section.begin} ... {section.end}")
        table = f"{section.begin}\n{render(section.load())}\n{section.end}"
        readme = readme[: found[0].start()] + table + readme[found[0].end() :]
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    current = args.readme.read_text()
    wanted = rewrite(current)
    if args.check:
        if wanted != current:
            print(f"{args.readme} is stale: run `make config-table`", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        args.readme.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
