"""Unit tests for Horovod compatibility mode without MPI ranks: the
HOROVOD_* -> GRADFLOW_* table (gradflow/horovod_compat/env.py: units,
precedence, ignored names), the on/off switch, the horovod.* -> gradflow.*
name map, real-Horovod detection and the once-only rank-0 notice."""

import io
import os

import pytest

from gradflow import horovod_compat as C
from gradflow.horovod_compat import env as E


def test_known_settings_are_copied_with_their_units():
    environ = {"HOROVOD_FUSION_THRESHOLD": "33554432", "HOROVOD_CYCLE_TIME": "2.5",
               "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_TIMELINE": "/tmp/t.json",
               "HOROVOD_TIMELINE_MARK_CYCLES": "1", "HOROVOD_LOG_LEVEL": "DEBUG",
               "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
               "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90"}
    report = E.apply(environ)
    assert environ["GRADFLOW_FUSION_THRESHOLD"] == "33554432"  # bytes in both
    assert environ["GRADFLOW_CYCLE_TIME"] == "2.5"             # milliseconds in both
    assert environ["GRADFLOW_CACHE_CAPACITY"] == "0"
    assert environ["GRADFLOW_TIMELINE"] == "/tmp/t.json"
    assert environ["GRADFLOW_TIMELINE_MARK_CYCLES"] == "1"
    assert environ["GRADFLOW_LOG_LEVEL"] == "debug"
    assert environ["GRADFLOW_STALL_CHECK_TIME"] == "30"
    assert environ["GRADFLOW_STALL_SHUTDOWN_TIME"] == "90"
    assert report.mapped["GRADFLOW_LOG_LEVEL"] == "HOROVOD_LOG_LEVEL"
    assert report.ignored == [] and report.overridden == [] and report.messages() == []


def test_gradflow_name_wins_and_is_reported():
    environ = {"HOROVOD_CYCLE_TIME": "5", "GRADFLOW_CYCLE_TIME": "0.5",
               "HOROVOD_FUSION_THRESHOLD": "1024"}
    report = E.apply(environ)
    assert environ["GRADFLOW_CYCLE_TIME"] == "0.5"
    assert environ["GRADFLOW_FUSION_THRESHOLD"] == "1024"
    assert report.overridden == [("HOROVOD_CYCLE_TIME", "GRADFLOW_CYCLE_TIME")]
    assert any("HOROVOD_CYCLE_TIME is ignored: GRADFLOW_CYCLE_TIME is set" in m
               for m in report.messages())


def test_an_empty_gradflow_value_does_not_win():
    environ = {"HOROVOD_CYCLE_TIME": "5", "GRADFLOW_CYCLE_TIME": ""}
    E.apply(environ)
    assert environ["GRADFLOW_CYCLE_TIME"] == "5"


def test_unknown_and_unsupported_names_are_listed_sorted():
    environ = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "9",
               "HOROVOD_TIMELINE": "DYNAMIC", "HOROVOD_CYCLE_TIME": "1", "PATH": "/bin"}
    report = E.apply(environ)
    assert report.ignored == ["HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
                              "HOROVOD_HIERARCHICAL_ALLREDUCE"]
    assert "GRADFLOW_TIMELINE" not in environ
    assert report.messages() == ["ignored (no gradflow equivalent): HOROVOD_TIMELINE, "
                                 "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, "
                                 "HOROVOD_HIERARCHICAL_ALLREDUCE"]


@pytest.mark.parametrize("disable,want", [("1", "0"), ("true", "0"), ("0", "45")])
def test_stall_check_disable_beats_the_warning_time(disable, want):
    environ = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "45", "HOROVOD_STALL_CHECK_DISABLE": disable}
    report = E.apply(environ)
    assert environ["GRADFLOW_STALL_CHECK_TIME"] == want
    assert report.ignored == []


def test_reapplying_is_stable_and_children_inherit_the_mapping():
    environ = {"HOROVOD_CYCLE_TIME": "3"}
    E.apply(environ)
    environ["HOROVOD_CYCLE_TIME"] = "4"  # a re-init after the user changed it
    report = E.apply(environ)
    assert environ["GRADFLOW_CYCLE_TIME"] == "4" and report.overridden == []
    child = dict(environ)              # an inherited environment: still ours
    assert E.apply(child).mapped == {"GRADFLOW_CYCLE_TIME": "HOROVOD_CYCLE_TIME"}


def test_every_mapped_name_is_a_real_gradflow_setting():
    from gradflow import _native
    names = {k["env"] for k in _native.config_keys()}
    assert {g for g, _, _ in E.HOROVOD_TO_GRADFLOW.values()} <= names


@pytest.mark.parametrize("value,want", [("1", True), ("TRUE", True), (" on ", True), ("", False),
                                        ("0", False), ("off", False)])
def test_switch_values(value, want):
    assert C.is_enabled({C.ENV_SWITCH: value}) is want
    assert C.is_enabled({}) is False


def test_switch_typo_is_an_error():
    with pytest.raises(ValueError, match="GRADFLOW_HOROVOD_COMPAT='maybe'"):
        C.is_enabled({C.ENV_SWITCH: "maybe"})


def test_before_init_does_nothing_when_off():
    environ = {"HOROVOD_CYCLE_TIME": "3"}
    assert C.before_init(environ) == {} and "GRADFLOW_CYCLE_TIME" not in environ


def test_module_name_map():
    assert C.gradflow_name("horovod.torch") == "gradflow.torch"
    assert C.gradflow_name("horovod.tensorflow.keras") == "gradflow.tensorflow.keras"
    assert C.gradflow_name("horovod.keras.callbacks") == "gradflow.keras.callbacks"
    assert C.gradflow_name("horovod.torchvision") is None
    assert C.gradflow_name("horovod.spark") is None


def test_real_horovod_detection_ignores_the_shim(tmp_path):
    assert C.real_horovod_location([C.SHIM_DIR]) is None
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")
    found = C.real_horovod_location([C.SHIM_DIR, str(tmp_path)])
    assert found == str(tmp_path / "horovod" / "__init__.py")


def test_notice_once_on_rank_0_only(monkeypatch, tmp_path):
    monkeypatch.setenv(C.ENV_SWITCH, "1")
    monkeypatch.setenv("HOROVOD_NOT_A_SETTING", "x")
    monkeypatch.setattr(C, "_state", {"notified": False})
    monkeypatch.setattr(C, "real_horovod_location", lambda path=None: "/opt/horovod/__init__.py")
    C.before_init(dict(os.environ))
    out = io.StringIO()
    C.after_init(1, out)
    assert out.getvalue() == ""
    C.after_init(0, out)
    C.after_init(0, out)
    text = out.getvalue()
    assert text.count("/opt/horovod/__init__.py is shadowed") == 1
    assert text.count("ignored (no gradflow equivalent): HOROVOD_NOT_A_SETTING") == 1


def test_setting_error_names_the_horovod_variable():
    err = ValueError("gradflow: invalid value 'x' for GRADFLOW_CYCLE_TIME (--cycle-time-ms)")
    with pytest.raises(ValueError, match="set from HOROVOD_CYCLE_TIME") as info:
        C.reraise_with_origin(err, {"GRADFLOW_CYCLE_TIME": "HOROVOD_CYCLE_TIME"})
    assert info.value.__cause__ is err
    C.reraise_with_origin(err, {"GRADFLOW_TIMELINE": "HOROVOD_TIMELINE"})  # unrelated: returns


def test_unprovided_module_names_the_provided_ones():
    # with the mode on, horovod.spark (no gradflow counterpart) fails at import
    # with a message that says what the mode does provide
    from gradflow.horovod_compat import _AliasFinder
    with pytest.raises(ModuleNotFoundError) as e:
        _AliasFinder().find_spec("horovod.spark")
    assert "horovod.spark" in str(e.value) and "provides horovod.torch" in str(e.value), e.value
    assert e.value.name == "horovod.spark"
