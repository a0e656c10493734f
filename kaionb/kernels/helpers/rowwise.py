"""Row-wise building blocks shared by the transformer primitives (norms, softmax,
activations, INT8 quantization).

Every op sees its input as a 2-D ``[rows, n]`` view whose last axis is contiguous; rows
may sit at any element-aligned address. Data moves in 16-byte *words4* (four uint32:
4 float32, 8 float16/bfloat16 or 16 int8): a run of VEC elements starting at element
``e0`` of a row goes through one 128-bit ``ld.global.nc`` / ``st.global`` when it lies
inside the row and its address is 16-byte aligned, and element by element otherwise
(the row's ragged head and tail, or a row whose layout breaks the alignment).

Vector ``v`` of a row covers elements ``v*VEC - head .. v*VEC - head + VEC-1``, where
``head`` is the row's misalignment in elements: every full vector is then aligned, and a
row has ``ceil((head + n) / VEC)`` vectors (at most one more than ``ceil(n / VEC)``).

Float codecs turn words into float32 values in a caller's local array and back (round to
nearest even), so kernels do all arithmetic in float32. Storage bits travel as unsigned
integers: float32 arrays are passed as ``uint32[:, :]``, half types as ``uint16[:, :]``,
int8 as ``int8[:, :]`` (launch.py accepts any dtype of the right itemsize).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32, int64, types, uint16, uint32, uint64

from ..._device import compute_capability
from ...array import bfloat16
from ...ptx_patches import (
    bf16x2_to_f32x2,
    cp_async_cg_16,
    cvt_rn_bf16x2_f32,
    cvt_rn_f16x2_f32,
    device_function,
    f16x2_to_f32x2,
    global_addr,
    ld_global_nc_v4_u32,
    ld_global_v4_u32,
    ld_shared_v4_u32,
    shared_addr,
    st_global_v4_u32,
    st_shared_v4_u32,
)
from ...validation import fail
from .dtypes import f32_from_bits, f32_to_bits
from ..op import Plan

VEC_BYTES = 16
# Elements a thread keeps in registers on the one-pass path: 8 words4 of float32 or 4 of
# halves (32 registers of half data spilled under the 64-register cap of 1024 threads).
# A 1024-thread block holds a 32768-element row.
REG_ELEMS = 32
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), bfloat16)
_INT32_MAX = 2**31 - 1


class Codec:
    """Device helpers for one storage dtype: 16-byte runs in and out of a [rows, n] array.

    - ``load(x, r, e0, n, fill)``: words4 of elements e0.. of row r; elements outside
      [0, n) read as the storage bits ``fill``.
    - ``store(out, r, e0, n, words)``: writes the elements of words4 that lie in [0, n).
    - ``head(x, r)``: row r's misalignment in elements (int32).
    - ``load_fresh``: as ``load`` through the coherent path (``ld.global``, not ``.nc``),
      for data the kernel itself wrote earlier (the read-only path may serve stale lines).
    - float codecs: ``unpack(words, buf, off)`` → VEC float32 into ``buf[off:]``,
      ``pack(buf, off)`` → words4, ``decode(bits)`` / ``encode(value)`` for one element;
      ``unpack_pair`` / ``pack_pair``: the same for two words (VEC / 2 elements, one
      8-byte load or store).
    """

    def __init__(self, dtype, storage, vec, unpack=None, pack=None, decode=None,
                 encode=None, unpack_pair=None, pack_pair=None):
        self.dtype = np.dtype(dtype)
        self.storage = storage  # numba type name used in kernel signatures
        self.vec = vec
        self.reg_vecs = max(1, REG_ELEMS // vec)  # words4 per thread on the register path
        self.unpack, self.pack, self.decode, self.encode = unpack, pack, decode, encode
        self.unpack_pair, self.pack_pair = unpack_pair, pack_pair
        self.load, self.store, self.head, self.load_fresh = _make_io(vec, storage)


def _make_io(VEC, storage):
    ISZ = VEC_BYTES // VEC
    PER_WORD = VEC // 4
    BITS = 32 // PER_WORD
    MASK = (1 << BITS) - 1
    to_storage = {"uint32": uint32, "uint16": uint16, "int8": types.int8}[storage]

    @device_function
    def head(x, r):
        return int32((global_addr(x, (int64(r), int64(0))) & 15) // ISZ)

    @device_function
    def gather(x, r, e0, n, fill):
        w = cuda.local.array(4, uint32)
        for k in range(4):
            w[k] = uint32(0)
        for j in range(VEC):
            e = e0 + j
            bits = (uint32(x[r, e]) if 0 <= e < n else uint32(fill)) & uint32(MASK)
            w[j // PER_WORD] |= bits << uint32((j % PER_WORD) * BITS)
        return (w[0], w[1], w[2], w[3])

    @device_function
    def load(x, r, e0, n, fill):
        if e0 >= 0 and e0 + VEC <= n:
            a = global_addr(x, (int64(r), int64(e0)))
            if a & 15 == 0:
                return ld_global_nc_v4_u32(a)
        return gather(x, r, e0, n, fill)

    @device_function
    def load_fresh(x, r, e0, n, fill):
        if e0 >= 0 and e0 + VEC <= n:
            a = global_addr(x, (int64(r), int64(e0)))
            if a & 15 == 0:
                return ld_global_v4_u32(a)
        return gather(x, r, e0, n, fill)

    @device_function
    def store(out, r, e0, n, words):
        if e0 >= 0 and e0 + VEC <= n:
            a = global_addr(out, (int64(r), int64(e0)))
            if a & 15 == 0:
                st_global_v4_u32(a, words)
                return
        for j in range(VEC):
            e = e0 + j
            if 0 <= e < n:
                bits = (words[j // PER_WORD] >> uint32((j % PER_WORD) * BITS)) & uint32(MASK)
                out[r, e] = to_storage(bits)

    return load, store, head, load_fresh


# -- float codecs -----------------------------------------------------------------------
# unpack and unpack_pair differ only in their word count, pack in being two pack_pairs.

def _f32_unpacker(count):
    @device_function
    def unpack(words, buf, off):
        for k in range(count):
            buf[off + k] = f32_from_bits(words[k])

    return unpack


def _half_unpacker(count, to_f32x2):
    @device_function
    def unpack(words, buf, off):
        for k in range(count):
            lo, hi = to_f32x2(words[k])
            buf[off + 2 * k] = lo
            buf[off + 2 * k + 1] = hi

    return unpack


def _packer(pack_pair, half_vec):
    @device_function
    def pack(buf, off):
        lo = pack_pair(buf, off)
        hi = pack_pair(buf, off + half_vec)
        return (lo[0], lo[1], hi[0], hi[1])

    return pack


@device_function
def _pack_f32_pair(buf, off):
    return (f32_to_bits(buf[off]), f32_to_bits(buf[off + 1]))


def _half_codec(dtype, to_f32x2, from_f32x2):
    @device_function
    def pack_pair(buf, off):
        return (from_f32x2(buf[off], buf[off + 1]), from_f32x2(buf[off + 2], buf[off + 3]))

    @device_function
    def decode(bits):
        return to_f32x2(uint32(bits))[0]

    @device_function
    def encode(value):
        return uint16(from_f32x2(value, value) & uint32(0xFFFF))

    return Codec(dtype, "uint16", 8, _half_unpacker(4, to_f32x2), _packer(pack_pair, 4), decode,
                 encode, _half_unpacker(2, to_f32x2), pack_pair)


@device_function
def _decode_f32(bits):
    return f32_from_bits(uint32(bits))


CODECS = {
    np.dtype(np.float32): Codec(np.float32, "uint32", 4, _f32_unpacker(4),
                                _packer(_pack_f32_pair, 2), _decode_f32, f32_to_bits,
                                _f32_unpacker(2), _pack_f32_pair),
    np.dtype(np.float16): _half_codec(np.float16, f16x2_to_f32x2, cvt_rn_f16x2_f32),
    bfloat16: _half_codec(bfloat16, bf16x2_to_f32x2, cvt_rn_bf16x2_f32),
}
INT8 = Codec(np.int8, "int8", 16)

# Storage bits of -inf (softmax's fill for masked elements) and of 0.
NEG_INF_BITS = {np.dtype(np.float32): 0xFF800000, np.dtype(np.float16): 0xFC00, bfloat16: 0xFF80}


# -- chunks: several words4 of one array per step ------------------------------------------

class ChunkIO:
    """Device helpers that move a *chunk* of ``ch`` elements of one float array — ``ch``
    a multiple of the codec's VEC, so ``ch // VEC`` words4 — for kernels that walk
    several arrays of different widths in one step (a float16 x with its float32
    gradient: chunks of 8 elements, one words4 of x and two of the gradient).

    - ``words``: uint32 words per chunk (4 × ch / VEC), the size of its raw buffer.
    - ``load_aligned(a, r, e0, raw, off)``: the chunk at element e0 of row r into
      ``raw[off:off + words]`` through 128-bit read-only loads (row 16-byte aligned,
      e0 + ch <= n, the chunk's byte offset in the row below 2^32: the register paths;
      ``*_aligned`` offsets are 32-bit).
    - ``load(a, r, e0, n, fill, raw, off)``: the same for any e0 (elements outside [0, n)
      read as the storage bits ``fill``; misaligned words4 gathered).
    - ``unpack(raw, off, buf)``: ch float32 into ``buf[0:ch]``.
    - ``add_aligned(a, r, e0, buf)`` / ``add(a, r, e0, n, buf)``: ``buf[0:ch]`` += the
      chunk, one words4 at a time (4 registers of loaded data, not ``words``).
    - ``store_aligned(a, r, e0, buf)`` / ``store(a, r, e0, n, buf)``: ``buf[0:ch]``
      rounded to the storage dtype and written (``store`` skips elements outside [0, n)).
    - ``to_shared(raw, off, cache, at)`` / ``from_shared(cache, at, raw, off)``: the raw
      chunk to or from the uint32 shared array ``cache`` at word ``at`` (16-byte aligned).
    - ``load_async(a, r, e0, cache, at)``: the chunk straight from global into ``cache`` at
      word ``at`` through ``cp.async.cg`` (conditions of ``load_aligned``); the caller
      commits and waits for the group (the issuing thread then sees the words).
    """

    def __init__(self, codec, ch):
        VEC = codec.vec
        Q = ch // VEC
        if Q * VEC != ch:
            raise ValueError(f"ChunkIO: a chunk of {ch} is not a multiple of VEC={VEC}")
        self.words = 4 * Q
        ISZ = codec.dtype.itemsize
        load, store, unpack, pack = codec.load, codec.store, codec.unpack, codec.pack

        # Aligned chunks are addressed from the row's start plus e0 · itemsize: a kernel
        # that walks many rows then keeps one row pointer per array live, not one 64-bit
        # address per chunk and array (loop-invariant column offsets hoisted out of its
        # row loop spilled the norms' backward).
        @device_function
        def load_aligned(a, r, e0, raw, off):
            row = global_addr(a, (int64(r), int64(0)))
            for q in range(Q):
                words = ld_global_nc_v4_u32(row + uint64(uint32((e0 + q * VEC) * ISZ)))
                for i in range(4):
                    raw[off + 4 * q + i] = words[i]

        @device_function
        def load_any(a, r, e0, n, fill, raw, off):
            for q in range(Q):
                words = load(a, r, e0 + q * VEC, n, fill)
                for i in range(4):
                    raw[off + 4 * q + i] = words[i]

        @device_function
        def add_aligned(a, r, e0, buf):
            tmp = cuda.local.array(VEC, float32)
            row = global_addr(a, (int64(r), int64(0)))
            for q in range(Q):
                unpack(ld_global_nc_v4_u32(row + uint64(uint32((e0 + q * VEC) * ISZ))), tmp, 0)
                for i in range(VEC):
                    buf[q * VEC + i] += tmp[i]

        @device_function
        def add_any(a, r, e0, n, buf):
            tmp = cuda.local.array(VEC, float32)
            for q in range(Q):
                unpack(load(a, r, e0 + q * VEC, n, 0), tmp, 0)
                for i in range(VEC):
                    buf[q * VEC + i] += tmp[i]

        @device_function
        def unpack_chunk(raw, off, buf):
            for q in range(Q):
                o = off + 4 * q
                unpack((raw[o], raw[o + 1], raw[o + 2], raw[o + 3]), buf, q * VEC)

        @device_function
        def store_aligned(a, r, e0, buf):
            row = global_addr(a, (int64(r), int64(0)))
            for q in range(Q):
                st_global_v4_u32(row + uint64(uint32((e0 + q * VEC) * ISZ)),
                                 pack(buf, q * VEC))

        @device_function
        def store_any(a, r, e0, n, buf):
            for q in range(Q):
                store(a, r, e0 + q * VEC, n, pack(buf, q * VEC))

        @device_function
        def to_shared(raw, off, cache, at):
            for q in range(Q):
                o = off + 4 * q
                st_shared_v4_u32(shared_addr(cache, at + 4 * q),
                                 (raw[o], raw[o + 1], raw[o + 2], raw[o + 3]))

        @device_function
        def from_shared(cache, at, raw, off):
            for q in range(Q):
                words = ld_shared_v4_u32(shared_addr(cache, at + 4 * q))
                for i in range(4):
                    raw[off + 4 * q + i] = words[i]

        @device_function
        def load_async(a, r, e0, cache, at):
            row = global_addr(a, (int64(r), int64(0)))
            for q in range(Q):
                cp_async_cg_16(shared_addr(cache, at + 4 * q),
                               row + uint64(uint32((e0 + q * VEC) * ISZ)), uint32(16))

        self.load_aligned, self.load, self.unpack = load_aligned, load_any, unpack_chunk
        self.load_async = load_async
        self.add_aligned, self.add = add_aligned, add_any
        self.store_aligned, self.store = store_aligned, store_any
        self.to_shared, self.from_shared = to_shared, from_shared


@functools.cache
def chunk_io(codec, ch):
    """The :class:`ChunkIO` of ``codec`` for chunks of ``ch`` elements (one per pair)."""
    return ChunkIO(codec, ch)


# -- host side ----------------------------------------------------------------------------

def rows_view(op, name, x):
    """``x`` as a 2-D [rows, n] view sharing its memory (last axis contiguous), or a
    ValueError naming the op. Leading axes must collapse into one stride."""
    n = x.shape[-1] if x.ndim else 1
    lead = x.shape[:-1]
    rows = 1
    for d in lead:
        rows *= d
    # Leading axes must walk the rows with one stride (true of any C-contiguous batch).
    dims = [(d, s) for d, s in zip(lead, x.strides[:-1]) if d != 1]
    row_stride = dims[-1][1] if dims else n * x.itemsize
    for (_, outer), (d, inner) in zip(dims, dims[1:]):
        if outer != inner * d:
            fail(ValueError, op, name, "leading axes that collapse to one row stride (make "
                 "it contiguous first)", f"shape {x.shape} strides {x.strides}")
    if n > _INT32_MAX:
        fail(ValueError, op, name, f"a last axis of at most {_INT32_MAX} elements", n)
    return x._view((rows, n), (row_stride, x.itemsize))


def flat_view(x):
    """A C-contiguous array as one [1, size] row (elementwise ops: one long row)."""
    return x._view((1, x.size), (x.size * x.itemsize, x.itemsize))


def round_up(value, multiple):
    return -(-value // multiple) * multiple


# -- launch configuration for one-row-per-block kernels ----------------------------------

MAX_THREADS = 1024
# Threads per block once the row is long enough to give each a few vectors: 256 keeps
# 2-4 loads of 16 bytes in flight per thread on the [16384, 8192] rows (see perf log).
PREFERRED_THREADS = 256
# Threads of the wide-row (re-reading) kernels; 512 lets two blocks share an SM.
WIDE_THREADS = 512
# Dynamic shared memory of a wide-row block: the first part of its row is kept there for
# the second pass. 96 KiB is under the opt-in limit of sm_80 (163), sm_89 (99), sm_90 (227).
WIDE_CACHE_BYTES = 96 * 1024


def _rows_aligned(a):
    return a.ptr % VEC_BYTES == 0 and (a.shape[0] == 1 or a.strides[0] % VEC_BYTES == 0)


def rows_aligned(*arrays):
    """Whether every row of every [rows, n] view starts 16-byte aligned."""
    return all(_rows_aligned(a) for a in arrays)


def row_plan(codec, x2, *others, vec=None, per_thread=None, vec_bytes=VEC_BYTES):
    """(threads, cache_vecs, shared bytes) for a one-row-per-block kernel over the
    [rows, n] view ``x2``. The register path (cache_vecs = -1) needs every row of ``x2``
    and of ``others`` (out, weight...) 16-byte aligned, n a multiple of VEC, and the row to
    fit in ``codec.reg_vecs`` words4 per thread; anything else streams (module doc).
    Kernels that step in chunks (:class:`ChunkIO`) pass ``vec`` (elements per chunk),
    ``per_thread`` (chunks a thread holds on the register path) and ``vec_bytes`` (shared
    bytes a cached chunk takes)."""
    n = x2.shape[1]
    vec = codec.vec if vec is None else vec
    nv = -(-n // vec)
    per_thread = codec.reg_vecs if per_thread is None else per_thread
    if n % vec == 0 and nv <= per_thread * MAX_THREADS and rows_aligned(x2, *others):
        return round_up(max(-(-nv // per_thread), min(nv, PREFERRED_THREADS)), 32), -1, 0
    nv += 1  # a misaligned row has a partial words4 at each end
    cache_vecs = min(nv, WIDE_CACHE_BYTES // vec_bytes)
    return min(round_up(nv, 32), WIDE_THREADS), cache_vecs, cache_vecs * vec_bytes


# -- launch configuration for elementwise (grid-stride) kernels ---------------------------

# Elementwise kernels: 256 threads × 4 words4 per step, one step per thread where the grid
# allows (a grid capped at 132 SMs × 16 blocks ran gelu at 86% of copy: with 3 resident
# blocks per SM that is 5.3 waves, the last one a third full); blockIdx.y walks the rows
# of a strided view.
MAP_THREADS = 256
MAP_UNROLL = 4
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535


def map_plan(codec, x2, *others):
    """(grid, aligned) for an elementwise kernel over [rows, n] views: ``aligned`` (1) when
    every row of every array starts 16-byte aligned and n is a multiple of VEC, so the
    kernel can skip the per-words4 edge checks."""
    rows, n = x2.shape
    vec = codec.vec
    aligned = n % vec == 0 and rows_aligned(x2, *others)
    nv = -(-n // vec) + (0 if aligned else 1)
    gy = min(rows, MAX_GRID_Y)
    gx = max(1, min(-(-nv // (MAP_THREADS * MAP_UNROLL)), MAX_GRID_X))
    return (gx, gy), int(aligned)


def elementwise_views(op, **arrays):
    """[rows, n] views of same-shape arrays, in argument order: one long row each when all
    are C-contiguous (no per-row work), else the rows of :func:`rows_view`."""
    if all(a.is_c_contiguous for a in arrays.values()):
        return [flat_view(a) for a in arrays.values()]
    return [rows_view(op, name, a) for name, a in arrays.items()]


# -- rows split over a thread-block cluster (sm_90) ----------------------------------------

# Largest portable cluster (a launch may ask for more only with the non-portable opt-in,
# ``KernelDef(non_portable_cluster=True)``; the H100 allows 16).
MAX_CLUSTER = 8
CLUSTER_SIZES = (2, 4, 8)  # the sizes cluster_row_plan picks (a kernel variant each)
# Clusters of the forward row kernels (norms, softmax): 8 CTAs, or 16 (a 262144-element
# row of float32 in 512-thread CTAs). A row goes to a cluster only when one CTA cannot
# hold it (CLUSTER_ABOVE_THREADS), and cluster_row_plan then never picks fewer than 8.
ROW_CLUSTER_SIZES = (8, 16)
# ... in CTAs of at most this many threads: one 1024-thread CTA a SM left add_rms_norm
# float32 [512, 262144] at 75.6% of copy on 16 CTAs, 78.8% on the one-CTA streaming path.
CLUSTER_MAX_THREADS = 512
# ... and for float32 rows only. Halves in the same kernels ran slower than their one-CTA
# paths (H100, [2048, 65536] float16, % of copy, cluster / one CTA: rms_norm 74 / 80,
# layer_norm 55 / 71, softmax 68 / 90, add_rms_norm 76 / 93; as slow with 8 words4 a
# thread in 4-CTA clusters), float32 faster (rms_norm 85 / 74, layer_norm 82 / 71,
# softmax 90 / 75, add_rms_norm 93 / 86). docs/perf-log-primitives.md has the runs.
CLUSTER_DTYPES = (np.dtype(np.float32),)


def cluster_row_plan(nv, per_thread, max_cluster=MAX_CLUSTER, max_threads=MAX_THREADS):
    """(cluster size, threads) to hold a row of ``nv`` register units (words4, or whatever
    a kernel keeps ``per_thread`` of per thread) in the registers of one thread-block
    cluster: the smallest cluster whose CTAs need at most PREFERRED_THREADS threads (more
    CTAs per SM keep loads in flight across the reduction barriers), capped at
    ``max_cluster`` CTAs of up to ``max_threads``. None when that cannot hold the row."""
    size = 1
    while size < max_cluster and -(-nv // size) > per_thread * PREFERRED_THREADS:
        size *= 2
    chunk = -(-nv // size)
    if chunk > per_thread * max_threads:
        return None
    return size, round_up(max(-(-chunk // per_thread), min(chunk, PREFERRED_THREADS)), 32)


@functools.cache
def row_slice(size):
    """Device function ``(nv) -> (r, c0, c1)`` for kernels that hold a row of ``nv``
    register units: the row this CTA works on and its run ``[c0, c1)`` of the units. One
    CTA per row (``size`` 1): row blockIdx.x, all of it; a cluster of ``size`` CTAs per
    row: row blockIdx.x // size, the rank-th run of ceil(nv / size) units."""
    CLUSTER = size

    @device_function
    def cta_row_slice(nv):
        chunk = (nv + CLUSTER - 1) // CLUSTER
        c0 = int32(cuda.blockIdx.x % CLUSTER) * chunk
        return int32(cuda.blockIdx.x // CLUSTER), c0, min(c0 + chunk, nv)

    return cta_row_slice


# Forward row kernels spread a row over a cluster only when one CTA cannot hold it in
# registers (more threads than this would be needed). H100 A/B in
# docs/perf-log-primitives.md.
CLUSTER_ABOVE_THREADS = MAX_THREADS


def row_cluster_plan(kernels, codec, x2, *others, per_thread=None):
    """The :class:`~kaionb.kernels.op.Plan` of a forward row kernel's register path spread
    over a thread-block cluster per row (sm_90, CLUSTER_DTYPES; the conditions of
    :func:`row_plan`'s register path, ``per_thread`` words4 a thread), or None where one
    CTA holds the row (``row_plan``) or no cluster can. ``kernels``: cluster size -> the
    kernel variant (ROW_CLUSTER_SIZES). A cluster beyond the portable 8 is taken only
    where the driver says one can be resident."""
    rows, n = x2.shape
    per_thread = codec.reg_vecs if per_thread is None else per_thread
    nv = -(-n // codec.vec)
    if (codec.dtype not in CLUSTER_DTYPES or nv <= per_thread * CLUSTER_ABOVE_THREADS
            or n % codec.vec or compute_capability() < (9, 0)
            or not rows_aligned(x2, *others)):
        return None
    for max_cluster in (ROW_CLUSTER_SIZES[-1], MAX_CLUSTER):
        picked = cluster_row_plan(nv, per_thread, max_cluster, CLUSTER_MAX_THREADS)
        if picked is None:
            return None
        size, threads = picked
        plan = Plan.of(kernels[size], (rows * size,), (threads,), cluster=(size, 1, 1))
        if size <= MAX_CLUSTER or plan.kernel.max_active_clusters(plan.cluster, plan.block, 0):
            return plan
    return None
