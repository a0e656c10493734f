"""kaionb: CUDA kernels for Python, written in numba.cuda with inline PTX.

The public API is NumPy-style; this module only re-exports it.
"""

import numpy as _np

from ._block_cache import empty_cache
from ._device import (
    Device,
    Stream,
    current_stream,
    device,
    device_count,
    gpu_available,
    set_device,
    stream,
)
from .array import (
    DeviceArray,
    asarray,
    bfloat16,
    broadcast_to,
    empty,
    empty_like,
    expand_dims,
    flip,
    from_dlpack,
    full,
    moveaxis,
    permute_dims,
    reshape,
    squeeze,
    zeros,
    zeros_like,
)
from .kernels.creation import (
    arange,
    concatenate,
    eye,
    full_like,
    linspace,
    ones,
    ones_like,
    stack,
)
from .kernels.elementwise import (
    abs,
    add,
    bitwise_and,
    bitwise_invert,
    bitwise_or,
    bitwise_xor,
    ceil,
    clip,
    cos,
    divide,
    equal,
    exp,
    floor,
    floor_divide,
    greater,
    greater_equal,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    positive,
    pow,
    remainder,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sqrt,
    square,
    subtract,
    tanh,
    where,
)
from .kernels.indexing import take
from .kernels.reductions import (
    all,
    any,
    argmax,
    argmin,
    max,
    mean,
    min,
    prod,
    std,
    sum,
    var,
)
from .graphs import Graph, graph
from .kernels.attention import (
    attention,
    attention_bwd,
    attention_flash,
    attention_flash_causal,
    attention_tc,
    attention_tc_causal,
)
from .kernels.activations import fused_silu_gate, fused_silu_gate_bwd, gelu, gelu_bwd
from .kernels.matmul import (
    matmul,
    matmul_tc,
    matmul_tc_async,
    matmul_tc_bf16,
    matmul_tc_bf16_async,
)
from .kernels.matmul_int4 import (
    Int4Weight,
    dequantize_int4,
    matmul_int4,
    pack_int4,
    qkv_project_int4,
    quantize_int4,
)
from .kernels.matmul_int8 import matmul_int8, qkv_project_int8
from .kernels.norms import (
    add_rms_norm,
    add_rms_norm_bwd,
    layer_norm,
    layer_norm_bwd,
    rms_norm,
    rms_norm_bwd,
)
from .kernels.optim import adamw_step
from .kernels.quantize import dequantize_int8, quantize_int8
from .kernels.rope import rope, rope_bwd, rope_cache
from .kernels.softmax import softmax, softmax_bwd
from . import grad, random

__version__ = "0.1.0"
__array_api_version__ = "2023.12"

# The array API's dtype objects and constants (NumPy's: kaionb arrays carry NumPy dtypes).
float64, float32, float16 = _np.dtype(_np.float64), _np.dtype(_np.float32), _np.dtype(_np.float16)
int64, int32, int16, int8 = (_np.dtype(t) for t in (_np.int64, _np.int32, _np.int16, _np.int8))
uint64, uint32, uint16, uint8 = (_np.dtype(t) for t in (_np.uint64, _np.uint32, _np.uint16,
                                                         _np.uint8))
bool = _np.dtype(_np.bool_)  # noqa: A001  (the array API's name)
e, pi, inf, nan = _np.e, _np.pi, _np.inf, _np.nan
concat = concatenate  # the array API's name
newaxis = None
finfo, iinfo, result_type, can_cast = _np.finfo, _np.iinfo, _np.result_type, _np.can_cast


def astype(x, dtype, /, *, copy=True):
    """Return ``x`` converted to ``dtype`` on the device: the array API's ``astype``.

    As :meth:`DeviceArray.astype` (float to half types round to nearest even), except
    that ``copy=False`` returns ``x`` itself when it already has ``dtype``.

    Parameters
    ----------
    x : DeviceArray
        The array.
    dtype : dtype
        A dtype kaionb stores.
    copy : bool, optional
        False: no copy when ``x`` already has ``dtype``.

    Returns
    -------
    DeviceArray
        The converted array (new memory, or ``x`` itself).

    Raises
    ------
    TypeError
        Something that is not a dtype, or a dtype kaionb does not store.

    Examples
    --------
    >>> x = kaionb.asarray([1.0, 2.5])
    >>> kaionb.astype(x, kaionb.float16).get()
    array([1. , 2.5], dtype=float16)
    >>> kaionb.astype(x, np.float64, copy=False) is x
    True
    """
    if not copy and x.dtype == _np.dtype(dtype):
        return x
    return x.astype(dtype)

__all__ = sorted(name for name, value in globals().items() if not name.startswith("_")
                 and (type(value) is not type(_np) or name in ("grad", "random")))
