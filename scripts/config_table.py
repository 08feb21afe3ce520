"""The configuration tables of README.md and docs/parity.md, rendered from the models.

Each README section is one pydantic-settings class; its table (variable, default, meaning: the
field's ``description``) sits in README.md between the section's two marker comments. The policy
table of docs/parity.md is rendered from ``kdtree_parity.policy.Policy`` the same way: one row per
key, its value in each shipped policy (``default`` is the source of every default) and its
field's ``description``. ``make config-table`` rewrites them; ``--check``
(tests/unit/test_config_table.py) exits 1 when either file differs from what the models say.

    python scripts/config_table.py [--check] [--readme README.md] [--parity-doc docs/parity.md]
"""

from __future__ import annotations

import argparse
import enum
import importlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PARITY_DOC = ROOT / "docs" / "parity.md"


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

    def table(self) -> str:
        return render(self.load())


@dataclass(frozen=True)
class PolicySection(Section):
    """The policy keys' table: ``settings`` names the policy model (its fields are the policy
    file's sections, each a model of its keys); one column per shipped policy."""

    policies: tuple[str, ...] = ("default", "short")

    def table(self) -> str:
        from kdtree_parity.policy import load_policy

        model = self.load()
        loaded = [load_policy(name).policy.model_dump(mode="json") for name in self.policies]
        return render_policy(model, self.policies, loaded)


# One entry per generated table: a model added here needs its markers in README.md.
SECTIONS: tuple[Section, ...] = (
    Section("inference", "kdtree_inference.settings:InferenceSettings"),
    Section("promote", "kdtree_parity.promote.settings:PromoteSettings"),
    Section("parity", "kdtree_parity.settings:ParitySettings"),
    Section("kernel-build", "kdtree_verify._settings:BuildSettings"),
)

# docs/parity.md's generated tables.
PARITY_SECTIONS: tuple[Section, ...] = (PolicySection("policy", "kdtree_parity.policy:Policy"),)


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


def policy_value(value: Any) -> str:
    """A policy value as YAML writes it (``true``, ``null``, ``0.5``)."""
    return json.dumps(value)


def render_policy(model: Any, names: tuple[str, ...], policies: list[dict[str, Any]]) -> str:
    """The Markdown table of the policy keys: ``section.key``, each named policy's value (as
    loaded, so a key a file leaves out shows what it amounts to) and the key's description."""
    header = " | ".join(f"`{name}`" for name in names)
    rows = [f"| key | {header} | rule |", "|---" * (len(names) + 2) + "|"]
    for section, section_field in model.model_fields.items():
        for key, field in section_field.annotation.model_fields.items():
            if not field.description:
                raise ValueError(f"policy key {section}.{key} has no description for the table")
            values = " | ".join(policy_value(policy[section][key]) for policy in policies)
            rows.append(f"| `{section}.{key}` | {values} | {cell(field.description)} |")
    return "\n".join(rows)


def rewrite(readme: str, sections: tuple[Section, ...] = SECTIONS, doc: str = "README.md") -> str:
    """``readme`` with every section's table regenerated between its markers."""
    for section in sections:
        pattern = re.compile(re.escape(section.begin) + r"\n.*?" + re.escape(section.end), re.S)
        found = list(pattern.finditer(readme))
        if len(found) != 1:
            raise ValueError(f"{doc} needs exactly one {section.begin} ... {section.end}")
        table = f"{section.begin}\n{section.table()}\n{section.end}"
        readme = readme[: found[0].start()] + table + readme[found[0].end() :]
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--parity-doc", type=Path, default=PARITY_DOC)
    args = parser.parse_args(argv)
    stale = 0
    for path, sections in ((args.readme, SECTIONS), (args.parity_doc, PARITY_SECTIONS)):
        current = path.read_text()
        wanted = rewrite(current, sections, path.name)
        if wanted == current:
            continue
        if args.check:
            print(f"{path} is stale: run `make config-table`", file=sys.stderr)
            stale = 1
        else:
            path.write_text(wanted)
    return stale


if __name__ == "__main__":
    sys.exit(main())
