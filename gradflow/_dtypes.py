"""Maps array dtypes to the native core's DataType codes (native/common.h).

Framework-free: numpy dtypes and dtype *names*, so torch and TensorFlow
bindings can map their own dtypes by name without this file importing them.
"""
from __future__ import annotations

import numpy as np

# Must match enum class DataType in native/common.h.
UINT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL, INT8, INT16, UINT16 = range(11)

_BY_NAME = {
    "uint8": UINT8,
    "int8": INT8,
    "int16": INT16,
    "uint16": UINT16,
    "int32": INT32,
    "int64": INT64,
    "float16": FLOAT16,
    "bfloat16": BFLOAT16,
    "float32": FLOAT32,
    "float64": FLOAT64,
    "bool": BOOL,
}
NAME_OF = {code: name for name, code in _BY_NAME.items()}
SUPPORTED = ", ".join(_BY_NAME)
# Codes of the native-order numpy dtypes seen so far: `dtype.name` costs
# ~1 µs, paid twice per numpy collective before (issue 16, target 6: the
# per-call path of small collectives).
_CODE_BY_DTYPE: dict = {}


def code_of_name(name: str) -> int:
    """DataType code for a dtype name such as 'float32' or 'bfloat16'."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(f"gradflow: unsupported dtype {name}; supported: {SUPPORTED}") from None


def code_of_numpy(dtype: np.dtype) -> int:
    """DataType code for a numpy dtype (ml_dtypes.bfloat16 included). The
    core reads elements as native bytes, so a non-native byte order (e.g.
    '>f4' on x86) is refused: convert with `a.astype(a.dtype.newbyteorder('='))`."""
    dt = np.dtype(dtype)
    code = _CODE_BY_DTYPE.get(dt)
    if code is not None:
        return code
    if not dt.isnative:
        raise TypeError(f"gradflow: dtype {dt.str} is not in native byte order; convert it with "
                        "a.astype(a.dtype.newbyteorder('='))")
    code = code_of_name(dt.name)
    _CODE_BY_DTYPE[dt] = code
    return code


def numpy_dtype(code: int) -> np.dtype:
    """numpy dtype for a DataType code (bfloat16 needs ml_dtypes)."""
    name = NAME_OF[code]
    if name == "bfloat16":
        import ml_dtypes  # shipped with TensorFlow / JAX; only needed for bf16 numpy arrays

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
