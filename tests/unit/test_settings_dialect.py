"""The one dialect of the settings models (``kdtree_settings``): read from the environment or a
given mapping, blank is unset, and refusals name every bad variable and what it expects."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from typing import Annotated, ClassVar, Literal

import kdtree_settings
import pytest
from kdtree_settings import EnvSettings, SettingsError, on_off
from pydantic import BeforeValidator, Field, Strict, field_validator
from pydantic_settings import SettingsConfigDict

from kdtree_inference.settings import InferenceSettings
from kdtree_parity.settings import ParitySettings


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class DemoError(SettingsError):
    pass


class Demo(EnvSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_", frozen=True, extra="ignore")
    error_type: ClassVar[type[SettingsError]] = DemoError

    count: int = Field(3, ge=1, description="a count")
    ratio: float = Field(0.5, ge=0, description="a ratio")
    name: str = Field("", description="a name whose default is blank")
    colour: Colour = Field(Colour.RED, description="a colour")
    kind: Literal["a", "b"] = Field("a", description="a kind")
    switch: Annotated[bool, Strict(), BeforeValidator(on_off)] = Field(False, description="on/off")
    even: int = Field(2, description="an even number")

    @field_validator("even")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError("must be even")
        return value


def test_a_mapping_is_read_alone_and_the_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEMO_COUNT", "7")
    assert Demo.from_env().count == 7
    assert Demo.from_env({}).count == 3  # the environment does not mix into a mapping
    assert Demo.from_env({"DEMO_COUNT": "9", "OTHER": "x"}).count == 9


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_blank_is_unset(blank: str) -> None:
    every = {f"DEMO_{name.upper()}": blank for name in Demo.model_fields}
    assert Demo.from_env(every) == Demo.from_env({})
    assert Demo.from_env({}).name == ""


def test_values_are_read_after_trimming_and_switches_are_on_or_off() -> None:
    demo = Demo.from_env({"DEMO_COUNT": " 4 ", "DEMO_SWITCH": "ON", "DEMO_COLOUR": "blue"})
    assert (demo.count, demo.switch, demo.colour) == (4, True, Colour.BLUE)
    assert Demo.from_env({"DEMO_SWITCH": "off"}).switch is False


def test_every_bad_variable_is_named_with_what_it_expects_one_a_line() -> None:
    env = {
        "DEMO_COUNT": "0",
        "DEMO_RATIO": "-1",
        "DEMO_COLOUR": "green",
        "DEMO_KIND": "c",
        "DEMO_SWITCH": "yes",
        "DEMO_EVEN": "3",
    }
    with pytest.raises(DemoError) as refused:
        Demo.from_env(env)
    assert str(refused.value).splitlines() == [
        "DEMO_COUNT='0': expected an integer >= 1",
        "DEMO_RATIO='-1': expected a non-negative number",
        "DEMO_COLOUR='green': expected one of red|blue",
        "DEMO_KIND='c': expected one of a|b",
        "DEMO_SWITCH='yes': expected on or off",
        "DEMO_EVEN='3': must be even",
    ]
    assert isinstance(refused.value, ValueError)


def test_the_packages_speak_the_dialect() -> None:
    for model in (InferenceSettings, ParitySettings):
        assert issubclass(model, EnvSettings)
        assert issubclass(model.error_type, kdtree_settings.SettingsError)
    with pytest.raises(kdtree_settings.SettingsError, match="KDTREE_ENGINE_THREADS='0'"):
        InferenceSettings.from_env({"KDTREE_ENGINE_THREADS": "0"})
    with pytest.raises(kdtree_settings.SettingsError) as refused:
        ParitySettings.from_env({"KDTREE_PARITY_PORT": "x", "KDTREE_PARITY_LEASE_S": "y"})
    assert str(refused.value).splitlines() == [
        "KDTREE_PARITY_LEASE_S='y': expected a number",
        "KDTREE_PARITY_PORT='x': expected an integer",
    ]
    # blank is unset in both: the default, never an empty value
    assert ParitySettings.from_env({"KDTREE_PARITY_BASELINE_URL": " "}).baseline_url == (
        "http://127.0.0.1:30001"
    )


def test_the_engine_config_speaks_the_dialect_with_the_same_defaults() -> None:
    from kdtree_inference.engine.config import EngineConfig, EngineConfigError

    config = EngineConfig()
    assert (config.attention, config.dtype, config.kv_pool_size) == ("reference", "float32", 32768)
    assert EngineConfig.max_batch_size == 16  # the CLI's defaults come from the class
    assert "api_key" not in repr(EngineConfig(api_key="secret"))
    with pytest.raises(EngineConfigError) as refused:
        EngineConfig(attention="flash", attention_kv_splits=0, decode_step_delay_s=-1)
    assert str(refused.value).splitlines() == [
        "attention='flash': expected one of reference|op|triton|validate",
        "attention_kv_splits=0: expected an integer >= 1",
        "decode_step_delay_s=-1: expected a non-negative number",
    ]
    assert isinstance(refused.value, ValueError)
    with pytest.raises(EngineConfigError, match="needs the reference attention backend"):
        EngineConfig(attention="op", attention_kv_splits=2)


def test_the_dialect_and_the_parity_settings_import_no_torch() -> None:
    code = (
        "import sys, kdtree_settings, kdtree_parity.settings; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    path = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
