"""Gradient compression choices: they select the native 16-bit wire format.

Unlike Horovod's Compression.fp16 (which casts the tensor to fp16 before the
allreduce and sums in fp16), gradflow sends float32 buffers as 16-bit and
sums them in fp32 on arrival: one rounding per hop (ring) or one in all
(two-sync, mpi); docs/architecture.md, "16-bit wire", has the exact model.
Non-float32 tensors travel in their own dtype.
"""
from __future__ import annotations


class Compressor:
    """A wire format. `wire` is the native WireDtype code (-1: GRADFLOW_WIRE_DTYPE)."""

    def __init__(self, name: str, wire: int):
        self.name = name
        self.wire = wire

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class Compression:
    """Wire formats for float32 gradients.

    Compression.none (the default, as in Horovod) sends what the job's
    setting says: GRADFLOW_WIRE_DTYPE / --wire-dtype, fp32 unless set, so the
    launcher flag switches every wrapped optimizer at once. .fp16 and .bf16
    select a 16-bit wire for this call/optimizer; .fp32 forces full precision
    whatever the setting. .default is an alias of .none.
    """

    none = Compressor("none", -1)
    default = none
    fp32 = Compressor("fp32", 0)
    fp16 = Compressor("fp16", 1)
    bf16 = Compressor("bf16", 2)


def wire_code(compression) -> int:
    """Native wire code for a Compressor (None = setting default)."""
    if compression is None:
        return -1
    if not isinstance(compression, Compressor):
        raise TypeError(f"gradflow: compression must be one of Compression.none/fp16/bf16, got {compression!r}")
    return compression.wire
