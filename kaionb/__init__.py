"""kaionb: CUDA kernels for Python, written in numba.cuda with inline PTX.

The public API is NumPy-style; this module only re-exports it.
"""

from ._device import Stream, current_stream, gpu_available, stream
from .array import (
    DeviceArray,
    asarray,
    bfloat16,
    empty,
    empty_like,
    from_dlpack,
    full,
    zeros,
    zeros_like,
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
from .kernels.activations import fused_silu_gate, gelu
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
from .kernels.norms import layer_norm, rms_norm
from .kernels.quantize import dequantize_int8, quantize_int8
from .kernels.softmax import softmax
from . import grad, random

__version__ = "0.1.0"

__all__ = [
    "DeviceArray",
    "Graph",
    "Int4Weight",
    "Stream",
    "asarray",
    "attention",
    "attention_bwd",
    "attention_flash",
    "attention_flash_causal",
    "attention_tc",
    "attention_tc_causal",
    "bfloat16",
    "current_stream",
    "dequantize_int4",
    "dequantize_int8",
    "empty",
    "empty_like",
    "from_dlpack",
    "full",
    "fused_silu_gate",
    "gelu",
    "gpu_available",
    "graph",
    "grad",
    "layer_norm",
    "matmul",
    "matmul_int4",
    "matmul_int8",
    "pack_int4",
    "qkv_project_int4",
    "qkv_project_int8",
    "matmul_tc",
    "matmul_tc_async",
    "matmul_tc_bf16",
    "matmul_tc_bf16_async",
    "quantize_int4",
    "quantize_int8",
    "random",
    "rms_norm",
    "softmax",
    "stream",
    "zeros",
    "zeros_like",
]
