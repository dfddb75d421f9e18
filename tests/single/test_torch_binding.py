"""gradflow.torch pieces that need no launcher: dtype mapping by name, the
Horovod names exported, and that only gradflow/torch imports torch."""
import os
import re

import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dtype_codes_follow_native_enum():
    from gradflow import _dtypes
    from gradflow.torch.ops import dtype_code

    assert dtype_code(torch.bfloat16) == _dtypes.BFLOAT16 == 4
    assert dtype_code(torch.float32) == _dtypes.FLOAT32
    assert dtype_code(torch.bool) == _dtypes.BOOL
    with pytest.raises(TypeError, match="unsupported dtype int16"):
        dtype_code(torch.int16)


def test_horovod_names_exported():
    import gradflow.torch as hvd

    for name in ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
                 "cross_rank", "cross_size", "allreduce", "allreduce_", "allreduce_async",
                 "allreduce_async_", "grouped_allreduce", "grouped_allreduce_async", "allgather",
                 "allgather_async", "broadcast", "broadcast_", "broadcast_async",
                 "broadcast_async_", "alltoall", "reducescatter", "synchronize", "poll", "join",
                 "barrier", "broadcast_parameters", "broadcast_optimizer_state",
                 "broadcast_object", "allgather_object", "DistributedOptimizer", "Average", "Sum",
                 "Min", "Max", "Product", "Compression"]:
        assert hasattr(hvd, name), name
    assert hvd.Compression.fp16.wire == 1 and hvd.Compression.bf16.wire == 2


def test_torch_imported_only_under_gradflow_torch():
    offenders = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "gradflow")):
        if os.sep + "torch" in dirpath[len(ROOT):]:
            continue
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f)).read()
                if re.search(r"^\s*(import torch|from torch)", text, re.M):
                    offenders.append(os.path.join(dirpath, f))
    assert not offenders, offenders


