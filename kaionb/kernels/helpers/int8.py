"""Symmetric INT8 quantization on the device: the arithmetic ``kernels.quantize`` defines
(scale = max|x| / 127, q = clip(rint(x · 127 / max), −127, 127), half to even), shared by
its kernels and by kernels that quantize their own inputs (the QKV projection of
``kernels.matmul_int8``), so both give the same bits."""

from __future__ import annotations

import functools

from numba import cuda, float32, int8, int32, uint32

from kaionb.ptx_patches import device_function

from .reduce import block_max
from .rowwise import CODECS

QMAX = 127.0
ROUND_MAGIC = 12582912.0  # 1.5·2^23: v + M − M rounds v to an integer, half to even


@device_function
def inverse_scale(amax):
    """127 / amax; 0 for an all-zero group (its q are 0)."""
    return float32(QMAX) / amax if amax > float32(0.0) else float32(0.0)


@device_function
def quantize_value(v, inv):
    """rint(v · inv) clipped to ±127, as an int32 (exact rounding for |v · inv| ≤ 2^22:
    v is clipped first)."""
    t = min(max(v * inv, float32(-QMAX)), float32(QMAX))
    return int32((t + float32(ROUND_MAGIC)) - float32(ROUND_MAGIC))


@device_function
def quantize_word(f, at, inv):
    """``f[at:at + 4]`` (float32) quantized with ``inv`` (127 / amax) and packed into one
    word of int8 (element j in byte j)."""
    w = uint32(0)
    for j in range(4):
        w |= (uint32(quantize_value(f[at + j], inv)) & uint32(0xFF)) << uint32(8 * j)
    return w


@device_function
def quantize_words16(f, inv):
    """16 float32 values of ``f`` quantized with ``inv`` (127 / amax) and packed into one
    words4 of int8 (element j in byte j % 4 of word j // 4)."""
    return (quantize_word(f, 0, inv), quantize_word(f, 4, inv), quantize_word(f, 8, inv),
            quantize_word(f, 12, inv))


# words4 each thread of quantize_rows loads before it reduces: a 4096-element f16 row is one
# round trip for 128 threads (a warp per row looping over it took ~8 µs more per QKV call
# at M = 1 on the H100: one L2 round trip per 16 bytes per lane).
ROW_VECS_IN_FLIGHT = 4


@functools.lru_cache(maxsize=None)
def make_quantize_rows(dtype):
    """``quantize_rows(x, q, scale, r_begin, r_end, k_begin, k_end, n)`` for float rows of
    ``dtype`` (a :data:`rowwise.CODECS` key), called by every thread of a block whose size
    is a multiple of 32: row by row (r_begin ≤ r < r_end) the block finds max|x[r, :n]|
    over the whole row, writes ``scale[r]`` and ``q[0, r, k]`` for k_begin ≤ k < k_end.

    ``x`` [rows, n] in the codec's storage type (16-byte loads where aligned), ``q`` int8
    [1, rows, ld], ``scale`` float32. The results are visible to the block after the
    caller's barrier."""
    codec = CODECS[dtype]
    VEC = codec.vec
    R = ROW_VECS_IN_FLIGHT
    WORDS = 4 * R
    load, head_of, unpack = codec.load, codec.head, codec.unpack

    @device_function
    def quantize_rows(x, q, scale, r_begin, r_end, k_begin, k_end, n):
        scratch = cuda.shared.array(32, float32)
        words = cuda.local.array(WORDS, uint32)
        f = cuda.local.array(VEC, float32)
        tid = int32(cuda.threadIdx.x)
        T = int32(cuda.blockDim.x)
        for r in range(r_begin, r_end):
            head = head_of(x, r)
            nv = (head + n + VEC - 1) // VEC
            m = float32(0.0)
            for v0 in range(tid, nv, T * R):
                for i in range(R):  # all loads first: R requests in flight per thread
                    v = v0 + i * T
                    w = load(x, r, v * VEC - head, n, 0) if v < nv else (
                        uint32(0), uint32(0), uint32(0), uint32(0))
                    for j in range(4):
                        words[4 * i + j] = w[j]
                for i in range(R):
                    unpack((words[4 * i], words[4 * i + 1], words[4 * i + 2],
                            words[4 * i + 3]), f, 0)
                    for j in range(VEC):
                        m = max(m, abs(f[j]))
            m = block_max(m, scratch)
            inv = inverse_scale(m)
            if tid == 0:
                scale[r] = m * float32(1.0 / QMAX)
            first = (k_begin + head) // VEC
            for v in range(first + tid, (k_end + head + VEC - 1) // VEC, T):
                e0 = v * VEC - head
                unpack(load(x, r, e0, n, 0), f, 0)
                for j in range(VEC):
                    if k_begin <= e0 + j < k_end:
                        q[0, r, e0 + j] = int8(quantize_value(f[j], inv))

    return quantize_rows


__all__ = ["QMAX", "ROUND_MAGIC", "ROW_VECS_IN_FLIGHT", "inverse_scale", "make_quantize_rows",
           "quantize_value", "quantize_word", "quantize_words16"]
