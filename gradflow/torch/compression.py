# compression.py (torch) — Horovod's torch compression API: the `Compressor`
# interface (static compress(tensor) -> (tensor, ctx) / decompress(tensor,
# ctx)) that users subclass, and `Compression.none/fp16` that behave like
# Horovod's when called directly. Passed to a collective or the
# DistributedOptimizer, gradflow's own compressors select the native 16-bit
# wire (sum in fp32, gradflow/compression.py) instead of casting the tensor;
# any other Compressor runs around the collective as in Horovod (ops.py).
"""Gradient compression for ``import gradflow.torch as hvd`` (``hvd.Compression``)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ..compression import Compressor as _WireFormat
from ..compression import wire_code

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "FP32Compressor",
           "Compression", "split"]


class Compressor:
    """Horovod's interface: subclass it and override both static methods.
    `compress` returns the tensor to communicate and a context;
    `decompress` turns the reduced tensor back using that context."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """Return (tensor to communicate, context for decompress)."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Undo `compress` on the reduced tensor."""
        return tensor


class NoneCompressor(Compressor):
    """No compression (the default): the wire follows GRADFLOW_WIRE_DTYPE."""

    _gradflow_wire = -1


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, Any]:
    if tensor.dtype.is_floating_point:
        return tensor.to(dtype), tensor.dtype
    return tensor, tensor.dtype


def _uncast(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
    return tensor.to(ctx) if ctx is not None and ctx.is_floating_point else tensor


class _CastCompressor(Compressor):
    """Called directly: Horovod's cast of floating tensors to `_dtype` and
    back. Given to gradflow: a float32 tensor travels as `_dtype` and is
    summed in fp32 (one rounding per hop, not a 16-bit sum); other dtypes
    travel as they are."""

    _dtype: torch.dtype

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        return _cast(tensor, cls._dtype)

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return _uncast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Horovod's fp16 compression (see _CastCompressor)."""

    _gradflow_wire = 1
    _dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """As FP16Compressor with bfloat16 (gradflow's addition)."""

    _gradflow_wire = 2
    _dtype = torch.bfloat16


class FP32Compressor(Compressor):
    """Full precision whatever GRADFLOW_WIRE_DTYPE says (gradflow's addition)."""

    _gradflow_wire = 0


class Compression:
    """Horovod's `hvd.Compression`: `.none` (default) and `.fp16`, plus
    gradflow's `.bf16`, `.fp32` and `.default` (= `.none`)."""

    none = NoneCompressor
    default = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    fp32 = FP32Compressor


def split(compression: Any) -> Tuple[int, Optional[Any]]:
    """(native wire code, user compressor or None) for a `compression=`
    argument. gradflow's own (these classes, or gradflow.Compression.*)
    select a wire; anything else with compress/decompress is a user
    compressor that the caller applies around the collective."""
    if compression is None or isinstance(compression, _WireFormat):
        return wire_code(compression), None
    if isinstance(compression, type) and "_gradflow_wire" in vars(compression):
        return compression._gradflow_wire, None
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return -1, compression
    raise TypeError(f"gradflow: compression must be hvd.Compression.none/fp16/bf16/fp32 or a "
                    f"Compressor with compress() and decompress(), got {compression!r}")
