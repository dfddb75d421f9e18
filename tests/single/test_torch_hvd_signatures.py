# test_torch_hvd_signatures.py — pins the positional order, keyword names and
# defaults of gradflow.torch functions added for Horovod 0.28 parity (issue 14)
# so that a Horovod call with positional arguments keeps its meaning.
import importlib.util
import inspect

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed")

# (name, [(parameter, default or EMPTY)]) as in Horovod 0.28's horovod.torch;
# process_set's default is Horovod's global_process_set object (compared by name).
EMPTY = inspect.Parameter.empty
SCALE = [("prescale_factor", 1.0), ("postscale_factor", 1.0)]
EXPECTED = {
    "reducescatter": [("tensor", EMPTY), ("name", None), ("compression", "none"),
                      ("op", "Average"), ("process_set", "global_process_set")] + SCALE,
    "reducescatter_async": [("tensor", EMPTY), ("name", None), ("op", "Average"),
                            ("process_set", "global_process_set")] + SCALE,
    "grouped_reducescatter": [("tensors", EMPTY), ("name", None), ("compression", "none"),
                              ("op", "Average"), ("process_set", "global_process_set")] + SCALE,
    "grouped_reducescatter_async": [("tensors", EMPTY), ("name", None), ("op", "Average"),
                                    ("process_set", "global_process_set")] + SCALE,
    "grouped_allgather": [("tensors", EMPTY), ("name", None), ("process_set", "global_process_set")],
    "grouped_allgather_async": [("tensors", EMPTY), ("name", None), ("process_set", "global_process_set")],
    # + process_set, a keyword-only gradflow extra (None: the optimizer's own set)
    "broadcast_optimizer_state": [("optimizer", EMPTY), ("root_rank", EMPTY), ("model", None),
                                  ("process_set", None)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_matches_horovod(name):
    import gradflow.torch as hvd

    params = list(inspect.signature(getattr(hvd, name)).parameters.values())
    got = []
    for p in params:
        d = p.default
        if d is hvd.Compression.none:
            d = "none"
        elif d is hvd.global_process_set:
            d = "global_process_set"
        elif d is not EMPTY and d is not None and type(d) is type(hvd.Average) \
                and d == hvd.Average:
            d = "Average"  # by name: ReduceOp's integer values are another slice's
        got.append((p.name, d))
    assert got == EXPECTED[name]
    if name == "broadcast_optimizer_state":  # Horovod's positional calls keep their meaning
        assert params[-1].kind is inspect.Parameter.KEYWORD_ONLY


def test_set_backward_passes_per_step_is_a_method():
    from gradflow.torch.optimizer import _DistributedOptimizer

    sig = inspect.signature(_DistributedOptimizer.set_backward_passes_per_step)
    assert list(sig.parameters) == ["self", "passes"]
    assert isinstance(_DistributedOptimizer.__dict__["backward_passes_per_step"], property)
