"""GRADFLOW_SPARSE_POLICY and GRADFLOW_SPARSE_AUTO_COSTS: accepted values,
clear refusals (native/config.cc)."""
import pytest

from gradflow import _native

KEYS = {k["env"]: k for k in _native.config_keys()}


def test_policy_key_default_auto_with_choices():
    k = KEYS["GRADFLOW_SPARSE_POLICY"]
    assert k["default"] == "auto" and set(k["choices"]) == {"auto", "always"}
    assert k["flag"] == "--sparse-policy"
    for v in ("auto", "always", "AUTO"):
        _native.validate_config({"GRADFLOW_SPARSE_POLICY": v})


@pytest.mark.parametrize("env,value,fragment", [
    ("GRADFLOW_SPARSE_POLICY", "never", "not one of"),
    ("GRADFLOW_SPARSE_AUTO_COSTS", "1", "expected pairs"),
    ("GRADFLOW_SPARSE_AUTO_COSTS", "1,0", "> 0"),
    ("GRADFLOW_SPARSE_AUTO_COSTS", "1,2;", "expected pairs"),
    ("GRADFLOW_SPARSE_AUTO_COSTS", "1,x", "> 0"),
    ("GRADFLOW_SPARSE_AUTO_COSTS", "1,2;3,-4", "> 0"),
])
def test_bad_values_rejected(env, value, fragment):
    with pytest.raises(_native.GradflowError) as e:
        _native.validate_config({env: value})
    msg = str(e.value)
    assert env in msg and fragment in msg and KEYS[env]["flag"] in msg


@pytest.mark.parametrize("value", ["1,2", "0.5,3;2,1", "", "1e-3,4"])
def test_cost_schedules_accepted(value):
    _native.validate_config({"GRADFLOW_SPARSE_AUTO_COSTS": value})
