"""tests/support/prereq: a missing prerequisite skips on a workstation and fails under CI; missing hardware skips."""

import pytest

from tests.support.prereq import HARDWARE_ENV, in_ci, require, require_hardware, require_module


@pytest.mark.parametrize("value", ["true", "1", "yes", "True"])
def test_under_ci_a_missing_prerequisite_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match=r"CI is set.*promtool not installed"):
        require(None, "promtool not installed")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_kvcal"):
        require_module("no_such_module_kvcal", "a dev extra")


@pytest.mark.parametrize("value", [None, "", "false", "0", "FALSE"])
def test_elsewhere_a_missing_prerequisite_skips(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match="promtool not installed"):
        require("", "promtool not installed")
    with pytest.raises(pytest.skip.Exception, match="a dev extra"):
        require_module("no_such_module_kvcal", "a dev extra")


@pytest.mark.parametrize("ci", ["true", "false"])
def test_a_present_prerequisite_passes_either_way(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    require("/usr/bin/helm", "helm missing")
    assert require_module("json", "stdlib").dumps([]) == "[]"


def test_missing_hardware_skips_on_a_workstation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv(HARDWARE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="this machine's hardware: no AVX-512"):
        require_hardware(None, "no AVX-512")
    require_hardware("avx512f", "no AVX-512")


def test_missing_hardware_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv(HARDWARE_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"CI or .* is set.*no AVX-512"):
        require_hardware(None, "no AVX-512")


def test_missing_hardware_fails_where_the_ci_asks_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(HARDWARE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=rf"CI or {HARDWARE_ENV} is set.*no AVX-512"):
        require_hardware(False, "no AVX-512")
