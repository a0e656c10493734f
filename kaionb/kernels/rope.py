"""Rotary position embedding (RoPE) on queries or keys, and the cos/sin cache it reads.

A token at position p rotates each pair of its first R features by the angle p·θ_i,
θ_i = base^(−2i/R) (Su et al. 2021, https://arxiv.org/abs/2104.09864); c_i = cos(p·θ_i),
s_i = sin(p·θ_i), i < R/2:

    NeoX / LLaMA (interleaved=False), pairs (i, i + R/2):
        y[i]       = x[i]·c_i − x[i + R/2]·s_i
        y[i + R/2] = x[i + R/2]·c_i + x[i]·s_i
    GPT-J (interleaved=True), pairs (2i, 2i + 1):
        y[2i]      = x[2i]·c_i − x[2i + 1]·s_i
        y[2i + 1]  = x[2i + 1]·c_i + x[2i]·s_i

Features R..D−1 pass through unchanged (partial rotary: GPT-NeoX ``rotary_pct``, Phi).
The rotation is orthogonal, so the backward is the inverse rotation — the same kernel
with −s (``rope_bwd``).

x is [..., S, H, D] (``layout="bshd"``) or [..., H, S, D] (``"bhsd"``), any strides with a
contiguous last axis (q sliced out of a fused qkv buffer needs no copy). Memory floor: one
read and one write of x (2·x.nbytes; in place, 2·R/D of that — the pass-through features
are not touched); cos/sin ([max_seq, R/2] float32) are read per token from L2.

Kernel: a thread owns one *unit* of a (token, group of heads): a NeoX unit is the two
16-byte words at i and i + R/2 (it reads both halves of each pair before writing either,
so out may be x), a GPT-J unit one 16-byte word of whole pairs, a pass-through unit one
16-byte word copied. A thread does its unit for 2 (NeoX) or 4 (GPT-J) heads: it issues
the loads of x first, then reads the unit's cos/sin once for all of them, then rotates
and stores. Arithmetic in float32 (half types through the row-wise codecs); words that
are ragged or misaligned go element by element.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numba import cuda, float32, int32, uint32

from ..array import DeviceArray, asarray
from ..grad.record import active_tape
from ..ptx_patches import device_function
from ..validation import (
    as_array,
    check_contiguous,
    check_int,
    check_real,
    check_same_device,
    fail,
)
from .helpers.dtypes import f32_from_bits
from .helpers.rowwise import CODECS, FLOAT_DTYPES
from .launch import kernel
from .op import Plan, _span, fast_path, output, record, run

__all__ = ["rope", "rope_bwd", "rope_cache", "rope_frequencies", "rope_fwd", "rope_ref"]

# 256 threads, each with 4 words of x (64 bytes) in flight: a GPT-J unit covers 4 heads,
# a NeoX unit (two words per head) 2.
THREADS = 256
WORDS_IN_FLIGHT = 4
# Blocks per SM the register budget must allow: 4 × 256 threads caps a thread at 64
# registers (NeoX on halves took 66 uncapped, 3 blocks per SM, with no spill at 64).
MIN_BLOCKS = 4
LAYOUTS = ("bshd", "bhsd")
_F32 = np.dtype(np.float32)
_POSITION_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_INT32_MAX = 2**31 - 1


def _make_rope_kernel(codec, interleaved, name):
    """The kernel for one storage dtype and pair layout (module doc). ``sign`` multiplies
    sin: +1 forward, −1 the inverse rotation (backward)."""
    VEC = codec.vec
    S = codec.storage
    W = 1 if interleaved else 2  # words of x per head in a rotary unit
    HPT = WORDS_IN_FLIGHT // W  # heads per thread
    NCS = VEC // 2 if interleaved else VEC  # cos (and sin) values per rotary unit
    RAW = 4 * W * HPT
    load, store, unpack, pack = codec.load, codec.store, codec.unpack, codec.pack
    table_load, table_unpack = CODECS[_F32].load, CODECS[_F32].unpack
    NAN = float32(math.nan)

    @device_function
    def load_table(table, p, i0, half, buf):
        """buf[q] = table[p, i0 + q] for q < NCS (0 past the row): 16-byte words where NCS
        allows, else (GPT-J float32: 2 values) one by one."""
        if NCS >= 4:
            for q in range(NCS // 4):
                table_unpack(table_load(table, p, i0 + 4 * q, half, 0), buf, 4 * q)
        else:
            for q in range(NCS):
                i = i0 + q
                buf[q] = f32_from_bits(uint32(table[p, i])) if i < half else float32(0.0)

    # x and out are [1, n] views of their whole address range; row (b, t, h) starts at
    # element x0 + b·xsb + t·xss + h·xsh (see _flat_view), so the codecs' bounds
    # [e0, n) become [row + e, row + end).
    @kernel([f"void({S}[:, :], {S}[:, :], uint32[:, :], uint32[:, :], int32[:, :], int64, "
             "int64, int64, int64, int64, int64, int64, int64, int32, int32, int32, int32, "
             "int32, int32, int32, int32, int32, float32)"], name=name,
            launch_bounds=(THREADS, MIN_BLOCKS))
    def _rope_fwd_kernel(x, out, cos, sin, pos, x0, xsb, xss, xsh, o0, osb, oss, osh,
                         tokens, seq, heads, half, dim, units, rot_units, has_pos,
                         heads_inner, sign):
        raw = cuda.local.array(RAW, uint32)
        c = cuda.local.array(NCS, float32)
        s = cuda.local.array(NCS, float32)
        f = cuda.local.array(VEC, float32)
        g = cuda.local.array(VEC, float32)
        # Thread → (unit j, token, head group): j fastest, then whichever of token and head
        # group lies closer in memory (host: heads_inner). uint32 division: the host keeps
        # tokens · groups · units below 2^31.
        gid = uint32(uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x))
        groups = (heads + HPT - 1) // HPT
        q = uint32(gid // uint32(units))
        j = int32(gid - q * uint32(units))
        if heads_inner:
            token = int32(q // uint32(groups))
            h0 = int32(q - uint32(token) * uint32(groups)) * HPT
        else:
            group = q // uint32(tokens)
            token = int32(q - group * uint32(tokens))
            h0 = int32(group) * HPT
        if token >= tokens or h0 >= heads:
            return
        b = int32(uint32(token) // uint32(seq))
        t = token - b * seq
        xrow = x0 + b * xsb + t * xss
        orow = o0 + b * osb + t * oss
        rot = 2 * half
        if j < rot_units:
            # x first: its loads do not wait for the position and the cos/sin rows.
            e0 = j * VEC
            for k in range(HPT):
                if h0 + k < heads:
                    xr = xrow + (h0 + k) * xsh
                    if interleaved:
                        w = load(x, 0, xr + e0, xr + rot, 0)
                        for i in range(4):
                            raw[4 * k + i] = w[i]
                    else:
                        lo = load(x, 0, xr + e0, xr + half, 0)
                        hi = load(x, 0, xr + half + e0, xr + rot, 0)
                        for i in range(4):
                            raw[8 * k + i] = lo[i]
                            raw[8 * k + 4 + i] = hi[i]
            p = t
            if has_pos:
                p = pos[b, t]
            i0 = j * NCS
            if 0 <= p < cos.shape[0]:
                load_table(cos, p, i0, half, c)
                load_table(sin, p, i0, half, s)
                for k in range(NCS):
                    s[k] *= sign
            else:
                # Out of the cache (only when the caller skipped the position check):
                # NaN out, never an out-of-bounds read.
                for k in range(NCS):
                    c[k] = NAN
                    s[k] = NAN
            for k in range(HPT):
                if h0 + k < heads:
                    orw = orow + (h0 + k) * osh
                    if interleaved:
                        unpack((raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]),
                               f, 0)
                        for i in range(NCS):
                            a = f[2 * i]
                            a2 = f[2 * i + 1]
                            f[2 * i] = a * c[i] - a2 * s[i]
                            f[2 * i + 1] = a2 * c[i] + a * s[i]
                        store(out, 0, orw + e0, orw + rot, pack(f, 0))
                    else:
                        unpack((raw[8 * k], raw[8 * k + 1], raw[8 * k + 2], raw[8 * k + 3]),
                               f, 0)
                        unpack((raw[8 * k + 4], raw[8 * k + 5], raw[8 * k + 6],
                                raw[8 * k + 7]), g, 0)
                        for i in range(NCS):
                            a = f[i]
                            a2 = g[i]
                            f[i] = a * c[i] - a2 * s[i]
                            g[i] = a2 * c[i] + a * s[i]
                        store(out, 0, orw + e0, orw + half, pack(f, 0))
                        store(out, 0, orw + half + e0, orw + rot, pack(g, 0))
        else:
            # Pass-through features R..D−1: copied as stored bits (out of place only).
            e0 = rot + (j - rot_units) * VEC
            for k in range(HPT):
                if h0 + k < heads:
                    xr = xrow + (h0 + k) * xsh
                    w = load(x, 0, xr + e0, xr + dim, 0)
                    for i in range(4):
                        raw[4 * k + i] = w[i]
            for k in range(HPT):
                if h0 + k < heads:
                    orw = orow + (h0 + k) * osh
                    store(out, 0, orw + e0, orw + dim,
                          (raw[4 * k], raw[4 * k + 1], raw[4 * k + 2], raw[4 * k + 3]))

    return _rope_fwd_kernel


_KERNELS = {(interleaved, dt): _make_rope_kernel(
    codec, interleaved, f"_rope_fwd_kernel_{'gptj' if interleaved else 'neox'}_{dt.name}")
    for interleaved in (False, True) for dt, codec in CODECS.items()}


# -- host side: layouts ------------------------------------------------------------------

def _check_layout(op, layout):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        fail(ValueError, op, "layout", "'bshd' ([..., S, H, D]) or 'bhsd' ([..., H, S, D])",
             repr(layout))


def _bshd_view(op, name, a, layout):
    """``a`` as a [B, S, H, D] view of its memory (B: the batch axes merged, 1 without
    them; [S, D] is one head) and its batch shape, or a ValueError naming ``name``."""
    if a.ndim < 2:
        fail(ValueError, op, name, "[..., S, H, D] or [..., H, S, D] (3 or more dimensions) "
             "or [S, D]", f"{a.ndim} dimension(s) (shape {a.shape})")
    if a.ndim == 2:
        (S, D), (ss, sd) = a.shape, a.strides
        return a._view((1, S, 1, D), (0, ss, 0, sd)), ()
    (n1, n2, D), (s1, s2, sd) = a.shape[-3:], a.strides[-3:]
    (S, ss, H, sh) = (n1, s1, n2, s2) if layout == "bshd" else (n2, s2, n1, s1)
    batch, strides = a.shape[:-3], a.strides[:-3]
    dims = [(d, st) for d, st in zip(batch, strides) if d != 1]
    # The batch axes must walk their tokens with one stride (true of any contiguous batch).
    for (_, outer), (d, inner) in zip(dims, dims[1:]):
        if outer != inner * d:
            fail(ValueError, op, name, "batch axes (all but the last 3) that merge into one "
                 "stride", f"shape {a.shape} strides {a.strides}")
    return a._view((math.prod(batch), S, H, D), (dims[-1][1] if dims else 0, ss, sh, sd)), batch


def _flat_view(a4):
    """(``a4``'s whole address range as a [1, n] view, the element offset of a4[0, 0, 0, 0]
    in it, the element strides of its B, S, H axes): the kernel addresses rows itself."""
    lo, hi = _span(a4)
    isz = a4.itemsize
    n = (hi - lo) // isz
    return (a4._view((1, n), (n * isz, isz), lo - a4.ptr), (a4.ptr - lo) // isz,
            [st // isz for st in a4.strides[:3]])


def _check_no_self_overlap(op, name, a):
    """``out`` must not write one element twice: each axis's stride (by size) must step
    past everything the smaller ones cover. A broadcast (stride 0) out fails."""
    extent = a.itemsize
    for st, d in sorted((abs(st), d) for d, st in zip(a.shape, a.strides) if d > 1):
        if st < extent:
            fail(ValueError, op, name, "an array whose elements do not overlap each other",
                 f"shape {a.shape} strides {a.strides}")
        extent += (d - 1) * st


def _shares_memory(x, out):
    """Whether two arrays' address ranges meet (the same object for non-DeviceArrays)."""
    if not isinstance(x, DeviceArray) or not isinstance(out, DeviceArray):
        return x is out
    (lo, hi), (olo, ohi) = _span(x), _span(out)
    return x.size > 0 and out.size > 0 and lo < ohi and olo < hi


# -- host side: positions ----------------------------------------------------------------

def _is_host(obj):
    """What kaionb.asarray copies from the host (NumPy, lists, scalars)."""
    return isinstance(obj, np.ndarray) or not (hasattr(obj, "__dlpack__")
                                               or hasattr(obj, "__cuda_array_interface__"))


def _positions(op, name, positions, x, cos, layout, check):
    """``positions`` broadcast to x's batch and merged to [B, S] (int32 or int64, on the
    device), after its values are checked to lie in [0, max_seq): host data on the host;
    device data by one max on the device and one small copy back (``check``)."""
    x4, batch = _bshd_view(op, name, x, layout)
    S = x4.shape[1]
    max_seq = cos.shape[0]
    host = _is_host(positions)
    if host:
        p = np.asarray(positions)
        if p.dtype.kind not in "iu":
            fail(TypeError, op, "positions", "an integer array (int32 or int64)", p.dtype)
    else:
        p = as_array(op, "positions", positions)
        if p.dtype not in _POSITION_DTYPES:
            fail(TypeError, op, "positions", "dtype int32 or int64", p.dtype)
        check_same_device(op, **{name: x, "positions": p})
    want = f"shape (S,) or batch + (S,) = {batch + (S,)} (batch axes may be 1)"
    lead = p.shape[:-1]
    if (p.ndim == 0 or p.shape[-1] != S or len(lead) > len(batch)
            or any(d not in (1, bd) for d, bd in zip(lead[::-1], batch[::-1]))):
        fail(ValueError, op, "positions", want, p.shape)
    if host:
        if p.size and (p.min() < 0 or p.max() >= max_seq):
            fail(ValueError, op, "positions", f"values in [0, {max_seq}) (the rows of cos)",
                 f"values in [{p.min()}, {p.max()}]")
        p = np.ascontiguousarray(np.broadcast_to(p, batch + (S,)), np.int32)
        return asarray(p.reshape(math.prod(batch), S))
    if check and p.size:
        # A negative position reads as 2^32 or more through the unsigned view: one max.
        unsigned = p.view(np.uint32 if p.itemsize == 4 else np.uint64)
        if int(unsigned.max()) >= max_seq:
            lo, hi = int(p.min()), int(p.max())
            fail(ValueError, op, "positions", f"values in [0, {max_seq}) (the rows of cos)",
                 f"values in [{lo}, {hi}]")
    # Broadcast to batch + (S,) (stride 0 where p has 1 or no axis), then merge the batch.
    pad = len(batch) - len(lead)
    strides = [0] * pad + [0 if d == 1 else st for d, st in zip(lead, p.strides[:-1])]
    full = p._view(batch + (S,), tuple(strides) + p.strides[-1:])
    dims = [(d, st) for d, st in zip(batch, strides) if d != 1]
    if any(outer != inner * d for (_, outer), (d, inner) in zip(dims, dims[1:])):
        full = full.copy()  # a broadcast that does not merge: copy (positions are small)
        dims = [(d, st) for d, st in zip(batch, full.strides[:-1]) if d != 1]
    return full._view((math.prod(batch), S), (dims[-1][1] if dims else 0, full.strides[-1]))


# -- host side: the op -------------------------------------------------------------------

def _table(op, arg, table, D):
    """cos or sin: [max_seq, R/2] with 2 <= R <= D, a float type, contiguous last axis."""
    table = as_array(op, arg, table, dtypes=FLOAT_DTYPES)
    if table.ndim != 2 or table.shape[1] < 1 or 2 * table.shape[1] > D:
        fail(ValueError, op, arg, f"shape [max_seq, R/2] with 2 <= R <= D = {D}", table.shape)
    check_contiguous(op, arg, table, last_axis_only=True)
    return table


@fast_path
def _rope_op(op, x, cos, sin, positions, interleaved, layout, sign, *, out=None):
    """Validate and resolve ``out``; launch unless x is empty. ``positions``: None or
    [B, S] from :func:`_positions` (values checked there). Returns ``out``."""
    name = "grad" if op == "rope_bwd" else "x"
    x = as_array(op, name, x, dtypes=FLOAT_DTYPES)
    _check_layout(op, layout)
    if not isinstance(interleaved, (bool, np.bool_)):
        fail(TypeError, op, "interleaved", "a bool", type(interleaved).__name__)
    check_contiguous(op, name, x, last_axis_only=True)
    if any(st % x.itemsize for st in x.strides):
        fail(ValueError, op, name, f"strides that are multiples of {x.itemsize} bytes",
             x.strides)
    x4, _ = _bshd_view(op, name, x, layout)
    S, D = x4.shape[1], x4.shape[3]
    cos, sin = _table(op, "cos", cos, D), _table(op, "sin", sin, D)
    if sin.shape != cos.shape:
        fail(ValueError, op, "sin", f"the shape of 'cos' {cos.shape}", sin.shape)
    check_same_device(op, **{name: x, "cos": cos, "sin": sin})
    if positions is None and S > cos.shape[0]:
        fail(ValueError, op, "cos", f"at least S = {S} rows (positions=None: token t at "
             "position t)", f"{cos.shape[0]} rows")
    out = output(op, out, x.shape, x.dtype, device=x.device_id)
    _check_no_self_overlap(op, "out", out)
    return run(_rope_launch, op, x, x4, cos, sin, positions, interleaved, layout, sign,
               out=out)


def _rope_launch(op, x, x4, cos, sin, positions, interleaved, layout, sign, out):
    """One launch over (token, head group, unit) (module doc and the kernel's comments)."""
    codec = CODECS[x.dtype]
    o4, _ = _bshd_view(op, "out", out, layout)
    B, S, H, D = x4.shape
    in_place = out.ptr == x.ptr and out.strides == x.strides
    if cos.dtype != _F32:  # a half-type cache: to float32 first (exact)
        cos, sin = cos.astype(_F32), sin.astype(_F32)
    half = cos.shape[1]
    rot_units = -(-(2 * half if interleaved else half) // codec.vec)
    tail_units = 0 if in_place else -(-(D - 2 * half) // codec.vec)
    units = rot_units + tail_units
    groups = -(-H // (WORDS_IN_FLIGHT // (1 if interleaved else 2)))
    tokens = B * S
    if tokens * groups * units > _INT32_MAX:
        fail(ValueError, op, "x", "less than 2^31 units of work (tokens x head groups x "
             "16-byte words per head)", f"shape {x.shape}")
    xf, x0, (xsb, xss, xsh) = _flat_view(x4)
    of, o0, (osb, oss, osh) = _flat_view(o4)
    u32, i32 = np.dtype(np.uint32), np.dtype(np.int32)
    cos_bits, sin_bits = (t._view(t.shape, t.strides, dtype=u32) for t in (cos, sin))
    if positions is None:
        pos = cos_bits._view((1, 1), (0, 0), dtype=i32)  # never read
    else:
        # int64 positions are read as their low words: the values lie in [0, max_seq).
        pos = positions._view(positions.shape, positions.strides, dtype=i32)
    heads_inner = int(abs(xsh) <= abs(xss))  # bshd: a token's heads lie together
    blocks = -(-(tokens * groups * units) // THREADS)
    Plan.of(_KERNELS[bool(interleaved), x.dtype], (blocks,), (THREADS,)).launch(
        xf, of, cos_bits, sin_bits, pos, x0, xsb, xss, xsh, o0, osb, oss, osh, tokens, S, H,
        half, D, units, rot_units, int(positions is not None), heads_inner, float(sign))


def _rope_entry(op, sign, x, cos, sin, positions, interleaved, layout, out, check_positions):
    """The checks a replay of the fast path could not redo — they depend on more than
    the arrays' layouts: the positions' values, and whether out overlaps x — then
    :func:`_rope_op`."""
    name = "grad" if op == "rope_bwd" else "x"
    if out is not None and not _is_host(out):
        x = as_array(op, name, x, dtypes=FLOAT_DTYPES)
        out = as_array(op, "out", out)
        same = out.ptr == x.ptr and out.strides == x.strides and out.shape == x.shape
        if not same and _shares_memory(x, out):
            fail(ValueError, op, "out", f"{name} itself (in place) or memory apart from it",
                 f"out at 0x{out.ptr:x} overlapping {name} at 0x{x.ptr:x}")
    if positions is not None:
        x = as_array(op, name, x, dtypes=FLOAT_DTYPES)
        _check_layout(op, layout)
        x4, _ = _bshd_view(op, name, x, layout)
        cos = _table(op, "cos", cos, x4.shape[3])
        positions = _positions(op, name, positions, x, cos, layout, check_positions)
    return _rope_op(op, x, cos, sin, positions, interleaved, layout, float(sign), out=out)


def rope_fwd(x, cos, sin, *, positions=None, interleaved=False, layout="bshd", out=None,
             check_positions=True):
    """:func:`rope` without the tape."""
    return _rope_entry("rope", 1.0, x, cos, sin, positions, interleaved, layout, out,
                       check_positions)


_rope_op.uncached.public_names = {"rope_bwd": {"x": "grad"}}


def rope_bwd(grad, cos, sin, *, positions=None, interleaved=False, layout="bshd", out=None,
             check_positions=True):
    """Gradient of :func:`rope` with respect to x: ``grad`` rotated back.

    The same kernel with −sin (the rotation is orthogonal). Same arguments as
    :func:`rope`; the result has grad's dtype (float32 on the tape).

    Parameters
    ----------
    grad : DeviceArray or array_like
        The gradient of rope's output, laid out as its x.
    cos, sin : DeviceArray or array_like
        The forward's tables.
    positions : array_like or DeviceArray, optional
        The forward's positions.
    interleaved : bool, optional
        The forward's pairing.
    layout : {"bshd", "bhsd"}, optional
        The forward's layout.
    out : DeviceArray, optional
        An array of grad's shape and dtype to write (may be ``grad``).
    check_positions : bool, optional
        As :func:`rope`'s.

    Returns
    -------
    DeviceArray
        The gradient of x, in grad's dtype.

    Raises
    ------
    TypeError, ValueError
        As :func:`rope` (for ``grad`` in x's place).

    Examples
    --------
    >>> cos, sin = kaionb.rope_cache(16, 8)
    >>> x = kaionb.asarray(np.random.default_rng(0).standard_normal((16, 8)), np.float32)
    >>> back = kaionb.rope_bwd(kaionb.rope(x, cos, sin), cos, sin)
    >>> bool(np.allclose(back.get(), x.get(), atol=1e-5))
    True
    """
    return _rope_entry("rope_bwd", -1.0, grad, cos, sin, positions, interleaved, layout, out,
                       check_positions)


# -- the cos/sin cache -------------------------------------------------------------------

def _factor(op, scaling, key):
    value = scaling.get(key)
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not np.isfinite(value) or value <= 0):
        fail(ValueError, op, "scaling", f"a finite {key!r} > 0", repr(value))
    return float(value)


def rope_frequencies(dim, base=10000.0, scaling=None):
    """θ_i = base^(−2i/dim), i < dim/2, float64 (NumPy), with ``scaling`` applied (see
    :func:`rope_cache`)."""
    op = "rope_cache"
    expected = "an even integer >= 2 (the rotary dimensions R)"
    check_int(op, "dim", dim, expected)
    if dim < 2 or dim % 2:
        fail(ValueError, op, "dim", expected, repr(dim))
    check_real(op, "base", base)
    if not np.isfinite(base) or base <= 0:
        fail(ValueError, op, "base", "a finite number > 0", repr(base))
    inv_freq = float(base) ** (-np.arange(0, int(dim), 2, dtype=np.float64) / int(dim))
    if scaling is None:
        return inv_freq
    kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else None
    if kind == "linear":
        # Position interpolation (Chen et al. 2023): p / factor, i.e. θ / factor.
        return inv_freq / _factor(op, scaling, "factor")
    if kind == "llama3":
        # Llama 3.1: wavelengths 2π/θ shorter than L/high_freq_factor keep θ, longer than
        # L/low_freq_factor get θ/factor, and in between a blend linear in L/wavelength
        # (L = original_max_position_embeddings).
        factor = _factor(op, scaling, "factor")
        low = _factor(op, scaling, "low_freq_factor")
        high = _factor(op, scaling, "high_freq_factor")
        length = _factor(op, scaling, "original_max_position_embeddings")
        if high < low:
            fail(ValueError, op, "scaling", "high_freq_factor >= low_freq_factor",
                 f"{high} < {low}")
        wavelen = 2 * np.pi / inv_freq
        smooth = (length / wavelen - low) / (high - low) if high > low else 0.0
        blend = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return np.where(wavelen < length / high, inv_freq,
                        np.where(wavelen > length / low, inv_freq / factor, blend))
    fail(ValueError, op, "scaling", "None or a dict with 'type' 'linear' (factor) or "
         "'llama3' (factor, low_freq_factor, high_freq_factor, "
         "original_max_position_embeddings)", repr(scaling))


def rope_cache(seq_len, dim, base=10000.0, scaling=None):
    """Return the RoPE tables ``(cos, sin)`` for positions 0 .. seq_len − 1.

    ``cos[p, i] = cos(p·θ_i)``, θ_i = base^(−2i/dim), computed on the host in float64
    and uploaded as float32. Angles are float64 here; Hugging Face forms them in float32,
    so its tables carry about p·6e-8 radians of rounding at position p (6e-4 at 10^4).

    Parameters
    ----------
    seq_len : int
        The number of positions (>= 0).
    dim : int
        The rotary dimensions R (even, > 0).
    base : float, optional
        The frequency base (finite, > 0).
    scaling : dict, optional
        None, ``{"type": "linear", "factor": f}`` (positions divided by f), or
        ``{"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor":
        4.0, "original_max_position_embeddings": 8192}`` (Llama 3.1's frequency
        rescaling, as in Hugging Face's ``rope_type: "llama3"``; ``"rope_type"`` is
        accepted for ``"type"``).

    Returns
    -------
    cos : DeviceArray
        In float32, [seq_len, dim // 2], on the current device.
    sin : DeviceArray
        As ``cos``.

    Raises
    ------
    TypeError
        A ``seq_len`` or ``dim`` that is not an int, or a ``base`` that is not a number.
    ValueError
        A negative ``seq_len``, an odd or non-positive ``dim``, a ``base`` that is not
        finite and > 0, or a ``scaling`` that is not one of the forms above (unknown type,
        factors that are not finite and > 0, llama3 bands in the wrong order).

    Examples
    --------
    >>> cos, sin = kaionb.rope_cache(4096, 128)
    >>> cos.shape, cos.dtype
    ((4096, 64), dtype('float32'))
    >>> cos.get()[0, :2], sin.get()[0, :2]
    (array([1., 1.], dtype=float32), array([0., 0.], dtype=float32))
    """
    check_int("rope_cache", "seq_len", seq_len, "an integer >= 0")
    if seq_len < 0:
        fail(ValueError, "rope_cache", "seq_len", "an integer >= 0", repr(seq_len))
    angles = np.outer(np.arange(int(seq_len), dtype=np.float64),
                      rope_frequencies(dim, base, scaling))
    return asarray(np.cos(angles).astype(np.float32)), asarray(np.sin(angles).astype(np.float32))


# -- reference and public function -------------------------------------------------------

def rope_ref(x, cos, sin, positions=None, interleaved=False, layout="bshd", inverse=False):
    """float64 NumPy reference (host arrays). ``inverse``: rotate by −angle (the
    backward)."""
    x = np.asarray(x, np.float64)
    cos, sin = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    if inverse:
        sin = -sin
    # To [..., S, H, D]: [S, D] is one head; bhsd swaps its S and H axes.
    xs = x[:, None, :] if x.ndim == 2 else np.swapaxes(x, -3, -2) if layout == "bhsd" else x
    S, half = xs.shape[-3], cos.shape[1]
    pos = np.arange(S) if positions is None else np.asarray(positions)
    c, s = cos[pos][..., None, :], sin[pos][..., None, :]  # [..., S, 1, R/2]
    y = xs.copy()
    if interleaved:
        a, b = xs[..., 0:2 * half:2], xs[..., 1:2 * half:2]
        y[..., 0:2 * half:2], y[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = xs[..., :half], xs[..., half:2 * half]
        y[..., :half], y[..., half:2 * half] = a * c - b * s, b * c + a * s
    return y[:, 0, :] if x.ndim == 2 else np.swapaxes(y, -3, -2) if layout == "bhsd" else y


def rope(x, cos, sin, *, positions=None, interleaved=False, layout="bshd", out=None,
         check_positions=True):
    """Apply the rotary position embedding to queries or keys.

    Pairs of features rotate by their position's angles (module doc of
    ``kaionb.kernels.rope`` for the math). Recorded on the active ``kaionb.grad.Tape``
    when x requires a gradient (backward: :func:`rope_bwd`); in place is refused then (x
    would be lost).

    Parameters
    ----------
    x : DeviceArray or array_like
        [..., S, H, D] (``layout="bshd"``, the default) or [..., H, S, D] (``"bhsd"``);
        [S, D] is one head. float32, float16 or bfloat16; any strides with a contiguous
        last axis (a q sliced out of a fused [B, S, 3H, D] qkv is fine). Batch axes (all
        but the last 3) must merge into one stride.
    cos, sin : DeviceArray or array_like
        [max_seq, R/2] float32, e.g. from :func:`rope_cache` (float16 / bfloat16 tables
        are converted to float32 first, one small extra kernel per call); R =
        2·cos.shape[1] <= D features rotate, the rest pass through.
    positions : array_like or DeviceArray, optional
        None (token t is at position t; needs S <= max_seq), or integers (int32 / int64)
        of shape [S] or batch + [S] (batch axes may be 1): each token's position, e.g.
        offset + t when decoding with a KV cache. Host data (NumPy, lists) is checked on
        the host; a device array's range is checked by one max on the device and one
        small copy back (a synchronization).
    interleaved : bool, optional
        False: NeoX/LLaMA pairs (i, i + R/2); True: GPT-J pairs (2i, 2i + 1).
    layout : {"bshd", "bhsd"}, optional
        Where the sequence and head axes are.
    out : DeviceArray, optional
        An array of x's shape and dtype, contiguous last axis; may be x itself (in place: the
        pass-through features are then not touched). An out that shares memory with x
        otherwise is refused.
    check_positions : bool, optional
        False skips the range check of device positions (e.g. inside a CUDA graph
        capture): then a position outside [0, max_seq) gives NaN for its token's rotated
        features, never an out-of-bounds read.

    Returns
    -------
    DeviceArray
        The rotated array (a new one, or ``out``).

    Raises
    ------
    TypeError
        A dtype other than float32 / float16 / bfloat16, positions not int32 / int64, an
        ``interleaved`` that is not a bool, or an ``out`` that is not device memory or
        has another dtype.
    ValueError
        A layout other than bshd / bhsd, shapes that do not match (cos vs sin, R > D,
        positions vs x), a cache shorter than S or than a position, a negative position,
        a non-contiguous last axis or batch axes that do not merge, an out that partially
        overlaps x (or overwrites it while a tape records x's gradient). All before any
        launch.

    Examples
    --------
    >>> cos, sin = kaionb.rope_cache(4096, 64)
    >>> q = kaionb.asarray(np.ones((1, 16, 8, 64), np.float16))   # [B, S, H, D]
    >>> y = kaionb.rope(q, cos, sin)
    >>> y.shape, bool((y.get()[0, 0] == 1).all())                 # position 0: no rotation
    ((1, 16, 8, 64), True)
    >>> y = kaionb.rope(q[:, :1], cos, sin, positions=[100])      # decoding at position 100
    """
    needs_grad = getattr(x, "requires_grad", False) and active_tape() is not None
    if needs_grad and out is not None and _shares_memory(x, out):
        fail(ValueError, "rope", "out", "memory apart from x while a tape records x's "
             "gradient", "x itself (in place)")
    y = rope_fwd(x, cos, sin, positions=positions, interleaved=interleaved, layout=layout,
                 out=out, check_positions=check_positions)
    if needs_grad:
        record(lambda g: (rope_bwd(g, cos, sin, positions=positions, interleaved=interleaved,
                                   layout=layout, check_positions=False),), (x,), (y,))
    return y

