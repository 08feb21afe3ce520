"""KDTREE_VERIFY and the backend's other settings, parsed from an environment mapping."""

import pytest

from kdtree_inference.settings import InferenceSettings
from kdtree_inference.sglang.modes import (
    BF16_POOL_ATOL,
    FP8_POOL_ATOL,
    SettingsError,
    VerifyMode,
    VerifySettings,
)


def test_defaults_are_off_and_documented_values():
    settings = VerifySettings.from_env({})
    assert settings == VerifySettings()
    assert settings.mode is VerifyMode.OFF
    assert (settings.validate_every, settings.shadow_every) == (100, 0)
    assert (settings.atol, settings.rtol, settings.shadow_error_streak) == (None, 0.02, 3)
    assert not settings.compares and not settings.needs_kernel


def test_atol_defaults_by_the_pool_dtype_and_a_configured_one_wins():
    assert VerifySettings().resolved_for_pool(fp8_pool=False).atol == BF16_POOL_ATOL == 0.02
    assert VerifySettings().resolved_for_pool(fp8_pool=True).atol == FP8_POOL_ATOL == 0.125
    configured = VerifySettings.from_env({"KDTREE_VERIFY_ATOL": "0.05"})
    assert configured.resolved_for_pool(fp8_pool=True).atol == 0.05
    assert "atol=by pool dtype" in VerifySettings(VerifyMode.VALIDATE).describe()
    resolved = VerifySettings(VerifyMode.VALIDATE).resolved_for_pool(fp8_pool=True)
    assert "atol=0.125" in resolved.describe()


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("", VerifyMode.OFF),
        ("off", VerifyMode.OFF),
        (" On ", VerifyMode.ON),
        ("VALIDATE", VerifyMode.VALIDATE),
    ],
)
def test_mode_values_are_case_insensitive(raw, mode):
    assert InferenceSettings.from_env({"KDTREE_VERIFY": raw}).verify is mode


def test_every_setting_is_read():
    env = {
        "KDTREE_VERIFY": "on",
        "KDTREE_VALIDATE_EVERY": "7",
        "KDTREE_SHADOW_EVERY": "3",
        "KDTREE_VERIFY_ATOL": "0.5",
        "KDTREE_VERIFY_RTOL": "0",
        "KDTREE_SHADOW_ERROR_STREAK": "2",
    }
    settings = VerifySettings.from_env(env)
    assert settings == VerifySettings(VerifyMode.ON, 7, 3, 0.5, 0.0, 2)
    assert settings.compares and settings.needs_kernel
    assert "shadow every 3 steps" in settings.describe()
    assert not VerifySettings(VerifyMode.ON).compares  # on without shadow compares nothing
    assert VerifySettings(VerifyMode.VALIDATE).compares


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KDTREE_VERIFY": "yes"}, "KDTREE_VERIFY='yes': expected one of off|validate|on"),
        ({"KDTREE_VALIDATE_EVERY": "0"}, "KDTREE_VALIDATE_EVERY='0'"),
        ({"KDTREE_VALIDATE_EVERY": "ten"}, "KDTREE_VALIDATE_EVERY='ten'"),
        ({"KDTREE_SHADOW_EVERY": "-1"}, "KDTREE_SHADOW_EVERY='-1'"),
        ({"KDTREE_VERIFY_ATOL": "nan"}, "KDTREE_VERIFY_ATOL='nan'"),
        ({"KDTREE_VERIFY_RTOL": "-0.1"}, "KDTREE_VERIFY_RTOL='-0.1'"),
        ({"KDTREE_SHADOW_ERROR_STREAK": "0"}, "KDTREE_SHADOW_ERROR_STREAK='0'"),
    ],
)
def test_bad_values_are_refused_by_name(env, named):
    with pytest.raises(SettingsError) as error:
        VerifySettings.from_env(env)
    assert named in str(error.value)


def test_draft_extend_switch_reads_on_and_off_and_refuses_the_rest():
    assert VerifySettings.from_env({}).draft_extend is True
    assert VerifySettings.from_env({"KDTREE_DRAFT_EXTEND": "OFF"}).draft_extend is False
    with pytest.raises(SettingsError, match="KDTREE_DRAFT_EXTEND"):
        VerifySettings.from_env({"KDTREE_DRAFT_EXTEND": "maybe"})
    described = VerifySettings.from_env({"KDTREE_VERIFY": "on", "KDTREE_DRAFT_EXTEND": "off"})
    assert "draft extend on Triton" in described.describe()


def test_fp8_numerics_setting_is_read_and_refused_when_unknown():
    assert VerifySettings.from_env({}).fp8_numerics == "triton"
    assert VerifySettings.from_env({"KDTREE_FP8_NUMERICS": "fp16"}).fp8_numerics == "fp16"
    with pytest.raises(SettingsError, match="KDTREE_FP8_NUMERICS='e5m2'"):
        VerifySettings.from_env({"KDTREE_FP8_NUMERICS": "e5m2"})
    described = VerifySettings.from_env({"KDTREE_VERIFY": "on", "KDTREE_FP8_NUMERICS": "fp16"})
    assert "fp8 numerics fp16" in described.describe()
