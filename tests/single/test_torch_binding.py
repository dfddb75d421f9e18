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
    # int8/int16/uint16 are supported since issue 14 (Horovod accepts them)
    assert (dtype_code(torch.int8), dtype_code(torch.int16), dtype_code(torch.uint16)) == \
        (_dtypes.INT8, _dtypes.INT16, _dtypes.UINT16) == (8, 9, 10)
    with pytest.raises(TypeError, match="unsupported dtype complex64"):
        dtype_code(torch.complex64)


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
    from gradflow.torch.compression import split

    # gradflow's compressors select the native wire; a user Compressor is applied around it
    assert split(hvd.Compression.fp16) == (1, None) and split(hvd.Compression.bf16) == (2, None)
    assert split(hvd.Compression.none) == (-1, None) and split(hvd.Compression.fp32) == (0, None)
    import gradflow

    assert split(gradflow.Compression.fp16) == (1, None)  # the framework-free ones too

    class Mine(hvd.Compressor):
        pass

    assert split(Mine) == (-1, Mine)

    class Fp16Subclass(hvd.Compression.fp16):  # overriding compress makes it the user's
        @staticmethod
        def compress(tensor):
            return tensor, None

    assert split(Fp16Subclass) == (-1, Fp16Subclass)
    with pytest.raises(TypeError, match="compression must be"):
        split("fp16")


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




def test_sparse_join_report(monkeypatch):
    # Note [Sparse gradients and join] (gradflow/torch/sparse_join.py): a step
    # refused because a rank had joined is reported with the next join() (the
    # value rides on it), every rank raises when it returns, and a failed
    # join() on a rank whose optimizer allgathers sparse gradients says why
    from gradflow import collectives
    from gradflow._runtime import GradflowError
    from gradflow.torch import optimizer_state, sparse_join

    class S:  # what the report reads of an optimizer's _State
        sparse_as_dense, solo, prefix = False, False, "DistributedOptimizer7"
        names, sparse = ["DistributedOptimizer7.emb.weight", "DistributedOptimizer7.b"], {0: 1}

    rep = sparse_join._Report()
    assert sparse_join.REPORT in collectives.join_reports
    rep.record(S(), [GradflowError("gradflow: allgather 'x' failed: boom")])
    assert rep.value() == 0
    rep.check(0)  # nothing reported anywhere
    monkeypatch.setattr(sparse_join, "rank", lambda: 4)  # this rank, without a runtime
    rep.record(S(), [GradflowError("allgather 'DistributedOptimizer7.emb.weight.indices' "
                                   "cannot run while rank 1 has called join() (only "
                                   "allreduce can; ...")])
    assert rep.value() == 5  # 1 + this rank
    with pytest.raises(GradflowError, match="rank 2 among them.*sparse_as_dense=True"):
        rep.check(3)
    assert rep.value() == 0  # reset at every join()
    s = S()
    optimizer_state._LIVE.add(s)
    try:
        assert "DistributedOptimizer7 ('emb.weight',) allgathers sparse gradients" in rep.note()
        s.sparse_as_dense = True
        assert "DistributedOptimizer7" not in rep.note()
    finally:
        optimizer_state._LIVE.discard(s)
