"""README.md's configuration tables are the settings models' fields (scripts/config_table.py)."""

from __future__ import annotations

from pathlib import Path

import config_table
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_tables_are_what_the_settings_models_describe() -> None:
    readme = (ROOT / "README.md").read_text()
    assert config_table.rewrite(readme) == readme, "README.md is stale: run `make config-table`"


def test_every_field_of_every_section_has_a_row() -> None:
    readme = (ROOT / "README.md").read_text()
    for section in config_table.SECTIONS:
        settings = section.load()
        for name, field in settings.model_fields.items():
            assert field.description, f"{settings.__qualname__}.{name}"
            assert f"| `{config_table.env_var(settings, name, field)}` |" in readme


def test_a_stale_table_is_reported_and_regenerated(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    current = (ROOT / "README.md").read_text()
    readme.write_text(current.replace("every N verify steps", "every N steps", 1))
    assert config_table.main(["--check", "--readme", str(readme)]) == 1
    assert config_table.main(["--readme", str(readme)]) == 0
    assert readme.read_text() == current
    assert config_table.main(["--check", "--readme", str(readme)]) == 0


def test_a_section_whose_model_is_missing_fails_loudly() -> None:
    missing = config_table.Section("missing", "kdtree_inference.no_such_settings:Settings")
    readme = f"{missing.begin}\n{missing.end}\n"
    with pytest.raises(ModuleNotFoundError):
        config_table.rewrite(readme, (missing,))
    with pytest.raises(ValueError, match="needs exactly one"):
        config_table.rewrite("no markers", config_table.SECTIONS)


def test_defaults_are_shown_as_typed() -> None:
    from kdtree_inference.settings import VerifyMode

    shown = [config_table.shown_default(v) for v in (None, True, False, VerifyMode.ON, "", 3)]
    assert shown == ["unset", "`on`", "`off`", "`on`", "empty", "`3`"]


def test_parity_doc_policy_table_is_what_the_policy_models_describe() -> None:
    doc = (ROOT / "docs" / "parity.md").read_text()
    assert config_table.rewrite(doc, config_table.PARITY_SECTIONS, "parity.md") == doc, (
        "docs/parity.md is stale: run `make config-table`"
    )


def test_every_policy_key_has_a_row_with_the_shipped_values() -> None:
    from kdtree_parity.policy import Policy, load_policy

    doc = (ROOT / "docs" / "parity.md").read_text()
    default = load_policy("default").policy.model_dump(mode="json")
    short = load_policy("short").policy.model_dump(mode="json")
    for section, section_field in Policy.model_fields.items():
        for key in section_field.annotation.model_fields:
            row = (
                f"| `{section}.{key}` | {config_table.policy_value(default[section][key])} "
                f"| {config_table.policy_value(short[section][key])} |"
            )
            assert row in doc, row


def test_a_drifted_policy_table_is_reported_and_regenerated(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    doc = tmp_path / "parity.md"
    current = (ROOT / "docs" / "parity.md").read_text()
    drifted = current.replace(
        "| `gate.min_prompts` | 200 | 20 |", "| `gate.min_prompts` | 100 | 20 |"
    )
    assert drifted != current
    doc.write_text(drifted)
    args = ["--readme", str(readme), "--parity-doc", str(doc)]
    assert config_table.main(["--check", *args]) == 1
    assert config_table.main(args) == 0
    assert doc.read_text() == current
    assert config_table.main(["--check", *args]) == 0
