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
from . import random

__version__ = "0.1.0"

__all__ = [
    "DeviceArray",
    "Stream",
    "asarray",
    "bfloat16",
    "current_stream",
    "empty",
    "empty_like",
    "from_dlpack",
    "full",
    "gpu_available",
    "random",
    "stream",
    "zeros",
    "zeros_like",
]
