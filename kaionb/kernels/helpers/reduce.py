"""Warp and block reductions (sum, max) over float32 values.

Warp level: a butterfly of ``shfl.xor`` (numba's ``cuda.shfl_xor_sync``): after the five
steps (offsets 16, 8, 4, 2, 1) every lane holds the result, so no broadcast is needed.
Block level: each warp reduces, lane 0 of each warp writes its partial to a shared
``scratch`` array (float32, at least 32 elements, supplied by the caller so one buffer can
serve several reductions), warp 0 reduces the partials, and the result is broadcast
through ``scratch[0]``. Every thread of the block must call a block reduction, and the
block size must be a multiple of 32 (a partial warp would make the full-mask shuffle
undefined). The trailing barrier lets the caller reuse ``scratch`` at once.

Plain numba, but the CUDA simulator has no warp shuffles: under
``NUMBA_ENABLE_CUDASIM=1`` they raise AttributeError (``shfl_xor_sync``).
"""

from numba import cuda, float32

from kaionb.ptx_patches import device_function

FULL_MASK = 0xFFFFFFFF


@device_function
def warp_sum(x):
    """Sum of ``x`` over the 32 lanes of the warp, returned to every lane."""
    for offset in (16, 8, 4, 2, 1):
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
    return x


@device_function
def warp_max(x):
    """Maximum of ``x`` over the 32 lanes of the warp, returned to every lane."""
    for offset in (16, 8, 4, 2, 1):
        x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, offset))
    return x


@device_function
def block_sum(x, scratch):
    """Sum of ``x`` over the (1-D) block, returned to every thread.

    ``scratch``: shared float32 array of >= 32 elements. blockDim.x % 32 == 0.
    """
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    nwarps = cuda.blockDim.x // 32
    x = warp_sum(x)
    if lane == 0:
        scratch[warp] = x
    cuda.syncthreads()
    if warp == 0:
        # Lanes past the last warp contribute the sum's identity.
        v = scratch[lane] if lane < nwarps else float32(0.0)
        v = warp_sum(v)
        if lane == 0:
            scratch[0] = v
    cuda.syncthreads()
    total = scratch[0]
    cuda.syncthreads()
    return total


@device_function
def block_max(x, scratch):
    """Maximum of ``x`` over the (1-D) block, returned to every thread.

    ``scratch``: shared float32 array of >= 32 elements. blockDim.x % 32 == 0.
    """
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    nwarps = cuda.blockDim.x // 32
    x = warp_max(x)
    if lane == 0:
        scratch[warp] = x
    cuda.syncthreads()
    if warp == 0:
        # max is idempotent: lanes past the last warp repeat warp 0's partial.
        v = scratch[lane] if lane < nwarps else scratch[0]
        v = warp_max(v)
        if lane == 0:
            scratch[0] = v
    cuda.syncthreads()
    result = scratch[0]
    cuda.syncthreads()
    return result
