# test_elastic_names.py — the public names of gradflow's elastic modules:
# Horovod 0.28.1's (so that `from horovod.X.elastic import Y` ports with the
# import changed) and the ones docs/horovod_compat.md promises. The API JSON
# that test_horovod_compat.py checks lists `elastic` as one symbol per
# package, so the names inside the modules are kept in step here.
"""`gradflow.torch.elastic.State` was promised by the compat table but not
importable; this test catches that kind of drift."""
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "horovod_compat.md")

# Horovod 0.28.1's public names, read from its source: `__all__` where the
# module has one, plus what it defines or imports for its users.
#   horovod/torch/elastic/__init__.py: __all__ = TorchState, ElasticSampler, run
#   horovod/tensorflow/elastic.py (no __all__): defines run, TensorFlowKerasState,
#     TensorFlowState; imports ObjectState and HorovodInternalError from common
#   horovod/tensorflow/keras/elastic.py, horovod/keras/elastic.py: __all__ =
#     KerasState, CommitStateCallback, UpdateBatchStateCallback,
#     UpdateEpochStateCallback, run; imports TensorFlowKerasState
_KERAS = {"run", "KerasState", "TensorFlowKerasState", "CommitStateCallback",
          "UpdateBatchStateCallback", "UpdateEpochStateCallback"}
HOROVOD = {
    "gradflow.torch.elastic": {"run", "TorchState", "ElasticSampler"},
    "gradflow.tensorflow.elastic": {"run", "TensorFlowKerasState", "TensorFlowState",
                                    "ObjectState", "HorovodInternalError"},
    "gradflow.keras.elastic": _KERAS,
    "gradflow.tensorflow.keras.elastic": _KERAS,
}
# The compat table row (first Horovod module of the row) for each module.
ROW_OF = {"gradflow.torch.elastic": "horovod.torch",
          "gradflow.tensorflow.elastic": "horovod.tensorflow",
          "gradflow.keras.elastic": "horovod.tensorflow.keras",
          "gradflow.tensorflow.keras.elastic": "horovod.tensorflow.keras"}
NEEDS = {"gradflow.torch.elastic": "torch"}  # the others need tensorflow (keras backend)


def documented(horovod_module):
    """The names the `elastic` row of docs/horovod_compat.md lists after
    "with", up to the first ";" (what follows are notes)."""
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 3 and cells[1] == "`elastic`" and \
                    re.findall(r"`([\w.]+)`", cells[0])[:1] == [horovod_module]:
                listed = cells[2].split(" with ", 1)[1].split(";", 1)[0]
                return {n.split("(", 1)[0] for n in re.findall(r"`([^`]+)`", listed)}
    raise AssertionError(f"{DOC}: no `elastic` row for {horovod_module}")


@pytest.mark.parametrize("module", sorted(HOROVOD))
def test_horovod_and_documented_names_are_importable(module):
    pytest.importorskip(NEEDS.get(module, "tensorflow"))
    mod = importlib.import_module(module)
    doc = documented(ROW_OF[module])
    assert doc, f"{DOC}: the elastic row for {ROW_OF[module]} lists no names"
    expected = HOROVOD[module] | doc
    missing = sorted(n for n in expected if not hasattr(mod, n))
    assert not missing, f"{module} lacks {missing}"
    # `from gradflow.X.elastic import *` gives them too, and __all__ names only real objects
    assert not sorted(expected - set(mod.__all__)), f"{module}.__all__ lacks {sorted(expected - set(mod.__all__))}"
    assert all(hasattr(mod, n) for n in mod.__all__), mod.__all__


def test_state_classes_are_the_framework_free_ones():
    """gradflow.torch.elastic.State / ObjectState are gradflow.elastic's
    (one State class: a user's subclass works with every binding's run)."""
    pytest.importorskip("torch")
    import gradflow.elastic as core
    import gradflow.torch as hvd
    assert hvd.elastic.State is core.State
    assert hvd.elastic.ObjectState is core.ObjectState
    assert issubclass(hvd.elastic.TorchState, core.State)
