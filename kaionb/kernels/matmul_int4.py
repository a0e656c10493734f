"""INT4 weight-only matmul (W4A16, GPTQ): f16 / bf16 activations times 4-bit weights in
groups along K, each group with an f16 scale and, for asymmetric weights, a zero point:

    W[k, n] = scale[group(k), n] · (q[k, n] - zero[group(k), n])      q in 0 .. 15

(Frantar et al. 2022, https://arxiv.org/abs/2210.17323; GPTQ's own storage format is read
by :func:`pack_int4.from_gptq`). A weight is packed once, on the host, into an
:class:`Int4Weight`: the nibbles reordered into the fragment order the kernel loads
(``helpers.int4``), the scales and zeros in pairs per lane, act-order rows sorted by group.

Kernels:

- M up to STREAM_MAX_M: the weight-streaming kernel of ``helpers.int4`` — every lane
  loads 16 bytes of packed weight per 64 rows of K straight into registers, converts
  them to f16 / bf16 mma fragments with ``prmt``/``lop3``/``fma`` and runs ``mma.sync``
  against x staged in shared memory; split-K with the in-kernel fold where the N strips
  alone do not fill the GPU. The QKV projection is the same kernel over three weights (the
  grid's x covers the strips of w_q, then w_k, then w_v).
- more rows: the weight dequantized to f16 / bf16 once per call (``dequantize_int4``'s
  kernel, into a K-major buffer) and the dense matmul (wgmma on Hopper).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from numba import cuda, int32, int64, uint16, uint32

from .._device import multiprocessor_count
from ..array import DeviceArray, asarray, bfloat16, empty
from ..validation import as_array, as_dtype, check_int, fail
from .helpers.int4 import (
    MIN_GROUP,
    STAGE_K,
    STRIP_N,
    SYMMETRIC_ZEROS,
    THREADS,
    UNIT_K,
    WORDS_PER_UNIT,
    make_int4_block,
    word_dequantizer,
)
from .launch import kernel
from .matmul import _OUT_KIND, _output, matmul_fwd
from .matmul_int8 import _qkv_outputs
from .op import (C_CONTIGUOUS, Plan, arrival_workspace, device_guard, fast_path, output,
                 workspace)

_ACT_DTYPES = (np.dtype(np.float16), bfloat16)
_ACT = {np.dtype(np.float16): "f16", bfloat16: "bf16"}
_F32, _U16, _U32 = np.dtype(np.float32), np.dtype(np.uint16), np.dtype(np.uint32)
ONE_GROUP_SHIFT = 31  # gshift of a per-channel weight: every row of K in group 0
# Rows up to this run the weight-streaming kernel, more the dequantized dense matmul.
STREAM_MAX_M = 128
# Blocks of the streaming kernel resident per SM, by m16 tiles per block (launch bounds:
# 128 registers for two): at 147 registers (ptxas 12.9, sm_90) one block fit, and a
# 224-block grid at M = 1 ran as 1.7 waves at 656 GB/s (ncu, docs/perf-log-matmul.md).
# Four m16 tiles take ~200 registers (helpers.int4.STRIPS_PER_WARP).
BLOCKS_PER_SM = {1: 2, 2: 2, 4: 1}
# The blocks per SM the streaming grid aims at, by m16 tiles per block (split-K makes up
# what the N strips lack); swept on the H100 (perf-log #21).
TARGET_BLOCKS_PER_SM = {1: 1.0, 2: 1.0, 4: 0.5}


def _tiles_m(m: int) -> int:
    """m16 tiles per block of the streaming kernel for M rows."""
    return 1 if m <= 16 else 2 if m <= 32 else 4


# -- the packed weight ------------------------------------------------------------------------

class Int4Weight:
    """A 4-bit weight [K, N] packed for :func:`matmul_int4`.

    The layout is ``kaionb.kernels.helpers.int4``'s (module doc of
    ``kaionb.kernels.matmul_int4``). Make one with :func:`quantize_int4` or
    :func:`pack_int4` (:func:`pack_int4.from_gptq` for a GPTQ checkpoint) rather than
    with the constructor; it is read-only and lives on the device it was made on.

    Parameters
    ----------
    qweight : DeviceArray
        The packed codes (uint32 words).
    scales : DeviceArray
        The packed float16 scales.
    zeros : DeviceArray or None
        The packed zero points, or None for symmetric codes (zero 8).
    perm : DeviceArray or None
        The int32 row order of an act-order weight (rows sorted by group), or None.
    shape : tuple of int
        (K, N).
    group_size : int
        Rows per group, or -1 for one group per column.

    Attributes
    ----------
    shape : tuple of int
        (K, N).
    group_size : int
        Rows per group (-1: one group per column).
    symmetric : bool
        No zero points (zero 8).
    act_order : bool
        Rows stored sorted by group, x permuted to match in the kernel.
    nbytes : int
        The device bytes a matmul streams (weights, scales, zeros).
    device_id : int
        The GPU the weight lives on.

    Examples
    --------
    >>> w = kaionb.quantize_int4(np.ones((256, 64), np.float32), group_size=64)
    >>> w.shape, w.group_size, w.symmetric, w.act_order
    ((256, 64), 64, True, False)
    """

    __slots__ = ("qweight", "scales", "zeros", "perm", "shape", "group_size")

    def __init__(self, qweight: DeviceArray, scales: DeviceArray, zeros, perm, shape: tuple,
                 group_size: int):
        self.qweight, self.scales, self.zeros, self.perm = qweight, scales, zeros, perm
        self.shape, self.group_size = tuple(shape), int(group_size)

    @property
    def k(self) -> int:
        return self.shape[0]

    @property
    def n(self) -> int:
        return self.shape[1]

    @property
    def k_pad(self) -> int:
        return self.qweight.shape[1] // WORDS_PER_UNIT * UNIT_K

    @property
    def gshift(self) -> int:
        return ONE_GROUP_SHIFT if self.group_size == -1 else self.group_size.bit_length() - 1

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def act_order(self) -> bool:
        return self.perm is not None

    @property
    def device_id(self) -> int:
        return self.qweight.device_id

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.qweight, self.scales, self.zeros) if x is not None)

    def fast_path_parts(self) -> tuple:
        """What the op fast path keys a call on (kernels.op): the arrays and the shape."""
        return (self.qweight, self.scales, self.zeros, self.perm, self.shape, self.group_size)

    def dequantize(self, dtype=np.float16) -> DeviceArray:
        """Return the weight as a dense array: :func:`dequantize_int4` of this weight.

        Parameters
        ----------
        dtype : dtype, optional
            The result dtype: float16 (default) or bfloat16.

        Returns
        -------
        DeviceArray
            The [K, N] weight in its original row order.

        Raises
        ------
        TypeError
            A dtype other than float16 or bfloat16.

        Examples
        --------
        >>> w = kaionb.quantize_int4(np.full((128, 8), 7.0, np.float32))
        >>> w.dequantize().get()[0, :3]
        array([7., 7., 7.], dtype=float16)
        """
        return dequantize_int4(self, dtype)

    def __repr__(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        order = ", act-order" if self.act_order else ""
        return (f"Int4Weight(shape={self.shape}, group_size={self.group_size}, {kind}{order}, "
                f"device={self.device_id})")


def _host(op: str, name: str, x) -> np.ndarray:
    """Any array (NumPy, kaionb, CuPy, torch, ...) as a NumPy array on the host."""
    if isinstance(x, DeviceArray):
        return x.get()
    if hasattr(x, "__cuda_array_interface__") or (hasattr(x, "__dlpack__")
                                                  and not isinstance(x, np.ndarray)):
        try:
            return asarray(x).get()
        except (TypeError, ValueError):
            pass  # a host tensor with __dlpack__ (torch CPU): NumPy takes it
    try:
        host = np.asarray(x)
    except Exception:
        fail(TypeError, op, name, "an array", type(x).__name__)
    if host.dtype.hasobject:  # None, or objects NumPy could only box
        fail(TypeError, op, name, "an array", type(x).__name__)
    return host


def _check_group_size(op: str, group_size, k: int) -> int:
    expected = f"-1 (per channel) or a power of two ≥ {MIN_GROUP} (32, 64, 128, ...)"
    check_int(op, "group_size", group_size, expected)
    g = int(group_size)
    if not (g == -1 or (g >= MIN_GROUP and g & (g - 1) == 0)):
        fail(ValueError, op, "group_size", expected, g)
    if g != -1 and k % g:
        fail(ValueError, op, "group_size", f"a divisor of K = {k} (K must be a multiple of "
             "the group size)", g)
    return g


def pack_host(q: np.ndarray, scales: np.ndarray, zeros, group_size: int) -> tuple:
    """(qweight, scales, zeros) uint32 arrays of the packed layout (helpers.int4) from
    host arrays: q codes [K, N] (0 .. 15, in stored row order), scales float16 [groups,
    N], zeros (0 .. 16) [groups, N] or None (zeros None)."""
    k, n = q.shape
    k_pad, n_pad = -(-k // UNIT_K) * UNIT_K, -(-n // STRIP_N) * STRIP_N
    strips, units = n_pad // STRIP_N, k_pad // UNIT_K
    nib = np.zeros((k_pad, n_pad), np.uint32)  # padding: n = 0 (x is 0 there anyway)
    nib[:k, :n] = (q.astype(np.int32) - 8) & 0xF
    # k = 64u + 16i + 8h + 2t + e, column = 16s + 8c + g; nibble j = 4c + 2h + e of word
    # 4(4g + t) + i of unit u (helpers.int4).
    t = nib.reshape(units, 4, 2, 4, 2, strips, 2, 8).transpose(5, 0, 7, 3, 1, 6, 2, 4)
    t = t.reshape(strips, units * WORDS_PER_UNIT, 8) << (4 * np.arange(8, dtype=np.uint32))
    words = np.bitwise_or.reduce(t, axis=2).astype(np.uint32)
    groups_pad = 1 if group_size == -1 else -(-k_pad // group_size)

    def pairs(values: np.ndarray, bits: int) -> np.ndarray:
        v = np.zeros((groups_pad, n_pad), np.uint32)
        v[:values.shape[0], :n] = values
        v = v.reshape(groups_pad, strips, 2, 8).transpose(0, 1, 3, 2)
        return (v[..., 0] | (v[..., 1] << bits)).reshape(groups_pad, n_pad // 2)

    s_words = pairs(scales.astype(np.float16).view(np.uint16), 16)
    z_words = None if zeros is None else pairs(zeros.astype(np.uint8), 8)
    return words, s_words, z_words


def unpack_host(words: np.ndarray, s_words: np.ndarray, z_words, shape: tuple,
                group_size: int) -> tuple:
    """(q uint8 [K, N], scales float16 [groups, N], zeros uint8 [groups, N] or None): the
    inverse of :func:`pack_host`."""
    k, n = shape
    strips, units = words.shape[0], words.shape[1] // WORDS_PER_UNIT
    nib = (words.reshape(strips, units, 8, 4, 4, 1) >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    nib = nib.reshape(strips, units, 8, 4, 4, 2, 2, 2).transpose(1, 4, 6, 3, 7, 0, 5, 2)
    nib = nib.reshape(units * UNIT_K, strips * STRIP_N)[:k, :n]
    q = (nib.astype(np.int32) ^ 8).astype(np.uint8)  # n = q - 8  <=>  nibble = q ^ 8
    groups = 1 if group_size == -1 else k // group_size

    def unpairs(v: np.ndarray, bits: int, mask: int) -> np.ndarray:
        v = np.stack([v & mask, (v >> bits) & mask], axis=-1)  # [groups_pad, N_pad/2, 2]
        v = v.reshape(v.shape[0], strips, 8, 2).transpose(0, 1, 3, 2)
        return v.reshape(v.shape[0], strips * STRIP_N)[:groups, :n]

    scales = unpairs(s_words, 16, 0xFFFF).astype(np.uint16).view(np.float16)
    zeros = None if z_words is None else unpairs(z_words, 8, 0xFF).astype(np.uint8)
    return q, scales, zeros


def _unpack(w: Int4Weight) -> tuple:
    """(q, scales, zeros, perm) of a packed weight, on the host (unpack_host)."""
    q, scales, zeros = unpack_host(w.qweight.get(), w.scales.get(),
                                   None if w.zeros is None else w.zeros.get(), w.shape,
                                   w.group_size)
    return q, scales, zeros, None if w.perm is None else w.perm.get()


@device_guard
def pack_int4(q, scales, zeros=None, *, group_size: int = 128, g_idx=None) -> Int4Weight:
    """Pack unpacked 4-bit codes, scales and zero points into an :class:`Int4Weight`.

    The weight is ``scales[g, n] · (q[k, n] - zeros[g, n])`` with g the group of row k:
    ``k // group_size``, or ``g_idx[k]`` for an act-order checkpoint (each group must
    hold group_size rows; they are stored sorted by group and x is read in that order).
    Packing runs on the host; the weight lands on the device of the arrays given on a
    GPU (else the current device). Arrays may live on the host or on a device.

    Parameters
    ----------
    q : array_like of int
        The codes [K, N], each 0 .. 15.
    scales : array_like of float
        [K / group_size, N] (stored as float16, which must hold them).
    zeros : array_like of int, optional
        [K / group_size, N], each 0 .. 16, or None for symmetric codes (zero 8).
    group_size : int, optional
        A power of two ≥ 32 dividing K, or -1 for one group per column (scales [1, N]).
    g_idx : array_like of int, optional
        The group of each row [K] (act-order checkpoints), or None for ``k // group_size``.

    Returns
    -------
    Int4Weight
        The packed weight.

    Raises
    ------
    TypeError
        ``q`` or ``zeros`` that is not integers, ``scales`` that is not floats, an
        argument that is not an array, or a ``group_size`` that is not an int.
    ValueError
        ``q`` not 2-D or empty, codes outside 0 .. 15, zero points outside 0 .. 16,
        ``scales`` / ``zeros`` of another shape, scales that are not finite in float16,
        a ``group_size`` that is not -1 or a power of two ≥ 32 or does not divide K, or a
        ``g_idx`` of another shape or whose groups do not hold group_size rows each.

    Examples
    --------
    >>> q = np.full((64, 8), 9, np.uint8)          # codes; symmetric: zero point 8
    >>> scales = np.full((2, 8), 0.5, np.float32)  # group_size 32: K / 32 = 2 groups
    >>> w = kaionb.pack_int4(q, scales, group_size=32)
    >>> kaionb.dequantize_int4(w).get()[0, :3]
    array([0.5, 0.5, 0.5], dtype=float16)
    """
    op = "pack_int4"
    q = _host(op, "q", q)
    if q.ndim != 2 or q.dtype.kind not in "iu":
        fail(TypeError if q.ndim == 2 else ValueError, op, "q", "integer codes [K, N]",
             f"{q.dtype} array of shape {q.shape}")
    k, n = q.shape
    if k == 0 or n == 0:
        fail(ValueError, op, "q", "a non-empty [K, N]", f"shape {q.shape}")
    if q.min() < 0 or q.max() > 15:
        fail(ValueError, op, "q", "codes in 0 .. 15", f"values in {q.min()} .. {q.max()}")
    g = _check_group_size(op, group_size, k)
    groups = 1 if g == -1 else k // g
    scales = _host(op, "scales", scales)
    if scales.dtype.kind != "f":
        fail(TypeError, op, "scales", "a float array", scales.dtype)
    if scales.shape != (groups, n):
        fail(ValueError, op, "scales", f"shape ({groups}, {n}) (K / group_size, N)",
             f"shape {scales.shape}")
    s16 = scales.astype(np.float16)
    if not np.isfinite(s16).all():
        fail(ValueError, op, "scales", "finite values in float16 range", "inf or nan")
    if zeros is not None:
        zeros = _host(op, "zeros", zeros)
        if zeros.dtype.kind not in "iu":
            fail(TypeError, op, "zeros", "integer zero points", zeros.dtype)
        if zeros.shape != (groups, n):
            fail(ValueError, op, "zeros", f"shape ({groups}, {n})", f"shape {zeros.shape}")
        if zeros.min() < 0 or zeros.max() > 16:
            fail(ValueError, op, "zeros", "zero points in 0 .. 16",
                 f"values in {zeros.min()} .. {zeros.max()}")
    perm = None
    if g_idx is not None:
        g_idx = _host(op, "g_idx", g_idx)
        if g_idx.shape != (k,) or g_idx.dtype.kind not in "iu":
            fail(ValueError, op, "g_idx", f"integers of shape ({k},)",
                 f"{g_idx.dtype} of shape {g_idx.shape}")
        perm = np.argsort(g_idx, kind="stable")
        expect = np.arange(k) // (k if g == -1 else g)
        if not np.array_equal(g_idx[perm], expect):
            fail(ValueError, op, "g_idx", f"each group 0 .. {groups - 1} on exactly "
                 f"{k if g == -1 else g} rows", f"group sizes {np.bincount(g_idx).tolist()[:8]}…")
        if np.array_equal(perm, np.arange(k)):
            perm = None  # in order: no permutation
        else:
            q = q[perm]
    words, s_words, z_words = pack_host(q, s16, None if zeros is None else zeros.astype(np.uint8),
                                        g)
    up = asarray  # NumPy -> the current device
    return Int4Weight(up(words), up(s_words), None if z_words is None else up(z_words),
                      None if perm is None else up(perm.astype(np.int32)), (k, n), g)


@device_guard
def from_gptq(qweight, qzeros, scales, g_idx=None, group_size: int = 128, *,
              format: str = "gptq") -> Int4Weight:
    """Make an :class:`Int4Weight` from the tensors of a GPTQ checkpoint layer.

    The tensors as AutoGPTQ / transformers store them (bit layouts below); the weight is
    ``scales[g, n] · (q - zero)``. Called as ``kaionb.pack_int4.from_gptq``.

    Parameters
    ----------
    qweight : array_like of int32
        [K / 8, N]: bits 4j .. 4j + 3 (j = 0 the lowest) of ``qweight[i, n]`` are the
        code q of row 8i + j, column n.
    qzeros : array_like of int32
        [K / group_size, N / 8]: bits 4j .. 4j + 3 of ``qzeros[g, c]`` are the zero point
        of group g, column 8c + j — stored minus one in the ``"gptq"`` format (AutoGPTQ's
        v1, the common one: zero = stored + 1) and as is in ``"gptq_v2"``.
    scales : array_like of float16
        [K / group_size, N].
    g_idx : array_like of int32, optional
        [K] (act-order checkpoints: the group of each row), or None.
    group_size : int, optional
        The checkpoint's group size (-1: one group per column).
    format : {"gptq", "gptq_v2"}, optional
        How the zero points are stored.

    Returns
    -------
    Int4Weight
        The packed weight.

    Raises
    ------
    TypeError
        ``qweight`` or ``qzeros`` that is not 2-D int32, or what :func:`pack_int4`
        refuses.
    ValueError
        An unknown ``format``, ``qzeros`` of another shape, a bad ``group_size``, or what
        :func:`pack_int4` refuses.

    Examples
    --------
    >>> qweight = np.zeros((64 // 8, 8), np.int32)   # K = 64, N = 8: every code 0
    >>> qzeros = np.zeros((2, 1), np.int32)          # stored 0: zero point 1 ("gptq")
    >>> scales = np.ones((2, 8), np.float16)
    >>> w = kaionb.pack_int4.from_gptq(qweight, qzeros, scales, group_size=32)
    >>> kaionb.dequantize_int4(w).get()[0, :2]
    array([-1., -1.], dtype=float16)
    """
    op = "pack_int4.from_gptq"
    if format not in ("gptq", "gptq_v2"):
        fail(ValueError, op, "format", "'gptq' or 'gptq_v2'", repr(format))
    qweight = _host(op, "qweight", qweight)
    qzeros = _host(op, "qzeros", qzeros)
    for name, x in (("qweight", qweight), ("qzeros", qzeros)):
        if x.ndim != 2 or x.dtype not in (np.int32, np.uint32):
            fail(TypeError, op, name, "int32 [rows, columns]", f"{x.dtype} of shape {x.shape}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    g = _check_group_size(op, group_size, k)
    groups = 1 if g == -1 else k // g
    if qzeros.shape != (groups, -(-n // 8)):
        fail(ValueError, op, "qzeros", f"shape ({groups}, {-(-n // 8)}) (K / group_size, "
             f"N / 8 for qweight of shape {qweight.shape})", f"shape {qzeros.shape}")
    q, z = gptq_codes(qweight, qzeros, groups, n, format)
    return pack_int4(q, scales, z, group_size=g, g_idx=g_idx)


def gptq_codes(qweight: np.ndarray, qzeros: np.ndarray, groups: int, n: int,
               format: str) -> tuple:
    """(q uint8 [K, N], zeros int32 [groups, N]) read from GPTQ's packed int32 tensors
    (bit order in :func:`from_gptq`)."""
    shifts = 4 * np.arange(8, dtype=np.uint32)
    q = (qweight.view(np.uint32)[:, None, :] >> shifts[None, :, None]) & 0xF
    z = (qzeros.view(np.uint32)[:, :, None] >> shifts) & 0xF
    z = z.reshape(groups, -1)[:, :n].astype(np.int32) + (1 if format == "gptq" else 0)
    return q.reshape(-1, n).astype(np.uint8), z


pack_int4.from_gptq = from_gptq


@device_guard
def quantize_int4(w, group_size: int = 128, symmetric: bool = True) -> Int4Weight:
    """Quantize a float weight to 4 bits (round to nearest) into an :class:`Int4Weight`.

    ``w`` [K, N] is the ``b`` of ``x @ b``; each group of ``group_size`` rows of each
    column (-1: the whole column) gets its scale, on the host:

    - symmetric: scale = max|w| / 7, q = clip(rint(w / scale), -8, 7) + 8 (zero 8);
    - asymmetric: over [min(w, 0), max(w, 0)], scale = (max - min) / 15,
      zero = rint(-min / scale), q = clip(rint(w / scale) + zero, 0, 15).

    Scales are rounded to float16 first and q computed with the rounded scale.

    Parameters
    ----------
    w : array_like or DeviceArray
        The weight [K, N]: float16, bfloat16 or float32, on the host or a device.
    group_size : int, optional
        A power of two ≥ 32 dividing K, or -1 for one group per column.
    symmetric : bool, optional
        Symmetric codes (no zero points) or asymmetric ones.

    Returns
    -------
    Int4Weight
        The packed weight, on the device of a ``w`` on a GPU (else the current device).

    Raises
    ------
    TypeError
        A ``w`` that is not a float array, or a ``group_size`` that is not an int.
    ValueError
        A ``w`` that is not a non-empty 2-D array or holds NaN / inf, or a bad
        ``group_size``.

    Examples
    --------
    >>> w = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    >>> wq = kaionb.quantize_int4(w, group_size=128)
    >>> wq.shape, wq.nbytes
    ((256, 64), 8448)
    """
    op = "quantize_int4"
    w = _host(op, "w", w)
    if w.dtype not in (np.float16, np.float32, ml_dtypes.bfloat16, np.float64):
        fail(TypeError, op, "w", "float16, bfloat16 or float32", w.dtype)
    if w.ndim != 2 or w.size == 0:
        fail(ValueError, op, "w", "a non-empty 2-D array [K, N]", f"shape {w.shape}")
    q, s16, zeros = quantize_int4_host(op, w, _check_group_size(op, group_size, w.shape[0]),
                                       symmetric)
    return pack_int4(q, s16, zeros, group_size=group_size)


def quantize_int4_host(op: str, w: np.ndarray, g: int, symmetric: bool) -> tuple:
    """(q uint8 [K, N], scales float16 [groups, N], zeros uint8 or None) of
    :func:`quantize_int4`, in NumPy."""
    k, n = w.shape
    x = w.astype(np.float32).reshape(k // (k if g == -1 else g), -1, n)
    if not np.isfinite(x).all():
        fail(ValueError, op, "w", "finite values", "inf or nan")
    if symmetric:
        scale = np.abs(x).max(axis=1) / 7
        zero = np.full(scale.shape, 8.0, np.float32)
    else:
        lo, hi = np.minimum(x.min(axis=1), 0), np.maximum(x.max(axis=1), 0)
        scale = (hi - lo) / 15
    s16 = scale.astype(np.float16)
    if not np.isfinite(s16).all():
        fail(ValueError, op, "w", "values whose scales fit float16 (|w| ≤ 7·65504)",
             f"max |w| = {np.abs(x).max()}")
    sf = s16.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        safe = np.where(sf > 0, sf, 1)
        if not symmetric:
            zero = np.where(sf > 0, np.clip(np.rint(-lo / safe), 0, 15), 8)
        q = np.where(sf[:, None] > 0, np.rint(x / safe[:, None]) + zero[:, None], 8)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(k, n)
    return q, s16, None if symmetric else zero.astype(np.uint8)


# -- kernels ----------------------------------------------------------------------------------

def _make_stream_kernel(act: str, MT: int):
    """x @ W for one packed weight, or x @ w_q, x @ w_k, x @ w_v in one launch: the grid's x
    runs over blocks of BLOCK_N columns of w_q, then of w_k, then of w_v (``blocks_q``,
    ``blocks_kv`` each; w_k and w_v share N_kv), y over BM-row tiles of x, z over the
    splits of K. Each block runs ``helpers.int4.make_int4_block(act, MT)`` on its
    weight's arrays (``*_q``, ``*_k``, ``*_v``); ``gshift_*`` each weight's group shift,
    ``has_zero`` / ``has_perm`` bit g for weight g. A single matmul passes w_q's arrays
    three times and blocks_kv = 1 (never reached)."""
    block = make_int4_block(act, MT)
    BM = block.BLOCK_M
    STRIPS = block.BLOCK_N // STRIP_N  # strips per block
    arrays = ("uint16[:, :], " + "int32[::1], " * 3 + "uint32[:, ::1], " * 9
              + "float32[:, ::1], " * 3 + "uint16[:, ::1], " * 3 + "float32[::1], uint32[::1]")
    signature = f"void({arrays}, " + ", ".join(["int32"] * 17) + ")"

    @kernel([signature], name=f"_matmul_int4_fwd_kernel_{act}_m{BM}",
            max_dynamic_shared_bytes=block.SHARED_BYTES, launch_bounds=(THREADS, BLOCKS_PER_SM[MT]))
    def _matmul_int4_fwd_kernel(x, perm_q, perm_k, perm_v, w_q, w_k, w_v, s_q, s_k, s_v, z_q,
                                z_k, z_v, o32_q, o32_k, o32_v, o16_q, o16_k, o16_v, ws, counters,
                                M, K, K_pad, k_chunk, splits, kind, out_vec, x_vec, n_q, n_kv,
                                blocks_q, blocks_kv, gshift_q, gshift_k, gshift_v, has_zero,
                                has_perm):
        bx = int32(cuda.blockIdx.x)
        m0 = int32(cuda.blockIdx.y) * BM
        split = int32(cuda.blockIdx.z)
        g, strip0, n, gshift = int32(0), bx * STRIPS, n_q, gshift_q
        perm, w, s, z, o32, o16 = perm_q, w_q, s_q, z_q, o32_q, o16_q
        if bx >= blocks_q:
            g = int32(1) + (bx - blocks_q) // blocks_kv
            strip0 = ((bx - blocks_q) % blocks_kv) * STRIPS
            n = n_kv
            if g == 1:
                perm, w, s, z, o32, o16, gshift = perm_k, w_k, s_k, z_k, o32_k, o16_k, gshift_k
            else:
                perm, w, s, z, o32, o16, gshift = perm_v, w_v, s_v, z_v, o32_v, o16_v, gshift_v
        block(x, perm, w, s, z, o32, o16, ws, counters, M, n, K, K_pad, k_chunk, splits, kind,
              out_vec, x_vec, (has_perm >> g) & 1, (has_zero >> g) & 1, gshift, m0, strip0,
              split)

    _matmul_int4_fwd_kernel.block = block
    return _matmul_int4_fwd_kernel


_STREAM_KERNELS = {(act, mt): _make_stream_kernel(act, mt)
                   for act in ("f16", "bf16") for mt in (1, 2, 4)}


def _make_dequantize_kernel(act: str):
    """out[perm[k] (or k), n] = W[k, n] as f16 / bf16 bits, one packed word per thread
    (grid-stride): the same conversion and rounding as the streaming kernel's fragments.
    ``out`` [K, N] at any strides."""
    column_setup, dequantize_word = word_dequantizer(act)

    @kernel(["void(uint32[:, ::1], uint32[:, ::1], uint32[:, ::1], int32[::1], uint16[:, :], "
             "int32, int32, int32, int32, int32)"], name=f"_dequantize_int4_fwd_kernel_{act}")
    def _dequantize_int4_fwd_kernel(w, scales, zeros, perm, out, K, N, gshift, has_zero,
                                    has_perm):
        words_per_strip = int64(w.shape[1])
        total = int64(w.shape[0]) * words_per_strip
        step = int64(cuda.gridDim.x) * int64(cuda.blockDim.x)
        for idx in range(int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
                         + int64(cuda.threadIdx.x), total, step):
            strip = int32(idx // words_per_strip)
            word = int32(idx % words_per_strip)
            lane = (word % WORDS_PER_UNIT) // 4
            k = (word // WORDS_PER_UNIT) * UNIT_K + 16 * (word % 4) + 2 * (lane % 4)
            col_a = strip * STRIP_N + lane // 4
            s_col = strip * 8 + lane // 4
            group = k >> gshift  # a k16 step lies in one group (group size ≥ 32)
            zword = zeros[group, s_col] if has_zero != 0 else uint32(SYMMETRIC_ZEROS)
            off_a, off_b, sa2, sb2 = column_setup(scales[group, s_col], zword)
            b = dequantize_word(w[strip, word], off_a, off_b, sa2, sb2)
            for e in range(4):  # (col a: rows k, k+1), (col a: k+8, k+9), then col b
                col = col_a + 8 * (e // 2)
                for h in range(2):
                    r = k + 8 * (e % 2) + h
                    if r < K and col < N:
                        out[perm[r] if has_perm != 0 else r, col] = uint16(
                            (b[e] >> uint32(16 * h)) & uint32(0xFFFF))

    return _dequantize_int4_fwd_kernel


_DEQUANTIZE_KERNELS = {act: _make_dequantize_kernel(act) for act in ("f16", "bf16")}
DEQUANTIZE_THREADS = 256


# -- host paths -------------------------------------------------------------------------------

def _check_weight(op: str, name: str, w, x: DeviceArray | None = None) -> Int4Weight:
    if not isinstance(w, Int4Weight):
        fail(TypeError, op, name, "an Int4Weight (kaionb.quantize_int4, kaionb.pack_int4 or "
             "pack_int4.from_gptq)", type(w).__name__)
    if x is not None and w.device_id != x.device_id:
        fail(ValueError, op, name, f"a weight on device {x.device_id} (as x)",
             f"device {w.device_id}")
    return w


def _nothing(like: DeviceArray, shape: tuple, dtype) -> DeviceArray:
    """An empty view of ``dtype`` and ``shape`` (zeros in it): an argument no launch reads."""
    return like._view(shape, (np.dtype(dtype).itemsize,) * len(shape), dtype=np.dtype(dtype))


def _stream_launch(x2: DeviceArray, weights: list, outs: list) -> None:
    """The streaming kernel for x2 [M, K] (f16 / bf16, unit stride along K) and one or three
    weights (w_q, w_k, w_v) into C-contiguous [M, N] outputs of one dtype."""
    m, k = x2.shape
    mt = _tiles_m(m)
    kdef = _STREAM_KERNELS[(_ACT[x2.dtype], mt)]
    bm, stage = 16 * mt, STAGE_K[mt]
    block_n = kdef.block.BLOCK_N
    blocks = [-(-w.n // block_n) for w in weights]
    n_blocks = blocks[0] + (2 * blocks[1] if len(weights) == 3 else 0)
    m_blocks = -(-m // bm)
    k_pad = weights[0].k_pad
    sms = multiprocessor_count()
    splits = min(-(-k_pad // stage), max(1, math.ceil(TARGET_BLOCKS_PER_SM[mt] * sms
                                                      / (n_blocks * m_blocks))))
    k_chunk = -(-(-(-k_pad // splits)) // stage) * stage
    splits = -(-k_pad // k_chunk)
    grid = (n_blocks, m_blocks, splits)
    if len(weights) == 1:
        weights, outs = weights * 3, outs * 3
    kind = _OUT_KIND[outs[0].dtype]
    out_vec = int(all(o.ptr % 16 == 0 and o.shape[1] % 8 == 0 for o in outs))
    ld = x2.strides[0] // 2
    x_vec = int(x2.ptr % 16 == 0 and ld % 8 == 0 and k % 8 == 0)
    if splits > 1:
        ws, counters = workspace(arrival_workspace, n_blocks * m_blocks * splits * bm * block_n
                                 * 4, n_blocks * m_blocks)
    else:
        ws, counters = _nothing(x2, (0,), _F32), _nothing(x2, (0,), _U32)
    no_perm, no_zeros = _nothing(x2, (0,), np.int32), _nothing(x2, (0, 0), _U32)
    x16 = x2._view(x2.shape, x2.strides, dtype=_U16)
    o32 = [o if o.dtype == _F32 else _nothing(o, (0, 0), _F32) for o in outs]
    o16 = [_nothing(o, (0, 0), _U16) if o.dtype == _F32 else o._view(o.shape, o.strides,
                                                                       dtype=_U16)
           for o in outs]
    args = ((x16,) + tuple(w.perm if w.act_order else no_perm for w in weights)
            + tuple(w.qweight for w in weights) + tuple(w.scales for w in weights)
            + tuple(no_zeros if w.symmetric else w.zeros for w in weights)
            + tuple(o32) + tuple(o16) + (ws, counters)
            + (m, k, k_pad, k_chunk, splits, kind, out_vec, x_vec, weights[0].n, weights[1].n,
               blocks[0], blocks[-1], weights[0].gshift, weights[1].gshift, weights[2].gshift,
               sum((not w.symmetric) << g for g, w in enumerate(weights)),
               sum(w.act_order << g for g, w in enumerate(weights))))
    Plan.of(kdef, grid, (THREADS,), kdef.block.SHARED_BYTES).launch(*args)


def _dequantize_launch(w: Int4Weight, out: DeviceArray) -> None:
    """W into ``out`` [K, N] (uint16 view of f16 / bf16, any strides)."""
    kdef = _DEQUANTIZE_KERNELS[_ACT[out.dtype]]
    total = w.qweight.size
    grid = (min(-(-total // DEQUANTIZE_THREADS), 64 * multiprocessor_count()),)
    args = (w.qweight, w.scales,
            w.zeros if not w.symmetric else _nothing(w.qweight, (0, 0), _U32),
            w.perm if w.act_order else _nothing(w.qweight, (0,), np.int32),
            out._view(out.shape, out.strides, dtype=_U16), w.k, w.n, w.gshift,
            int(not w.symmetric), int(w.act_order))
    Plan.of(kdef, grid, (DEQUANTIZE_THREADS,)).launch(*args)


def _activations(op: str, name: str, x) -> DeviceArray:
    x = as_array(op, name, x)
    if x.dtype not in _ACT_DTYPES:
        fail(TypeError, op, name, "float16 or bfloat16 activations (W4A16; cast float32 "
             "first)", x.dtype)
    if x.ndim < 1:
        fail(ValueError, op, name, "an array [..., K]", "a 0-d array")
    return x


def _rows(x: DeviceArray) -> DeviceArray:
    """x [..., K] as [M, K] rows with unit stride along K: a 2-D x with unit column stride
    as it is (the kernels take rows at any stride), else a reshape (a copy unless
    C-contiguous)."""
    if x.ndim == 2 and (x.shape[1] <= 1 or x.strides[1] == x.itemsize):
        return x
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


@fast_path
def matmul_int4_fwd(op: str, a, w, *, out=None, dtype=None) -> DeviceArray:
    """Validate every argument (before any launch) and run ``a @ W``."""
    a = _activations(op, "a", a)
    w = _check_weight(op, "w", w, a)
    if a.shape[-1] != w.k:
        fail(ValueError, op, "a", f"last dimension {w.k} (w is [K, N] = {list(w.shape)})",
             f"shape {a.shape}")
    rows_shape = a.shape[:-1]
    out = _output(op, out, dtype, rows_shape + (w.n,), a)
    if out.size == 0:
        return out
    x2 = _rows(a)
    out2 = out.reshape(x2.shape[0], w.n)
    if x2.shape[0] <= STREAM_MAX_M:
        _stream_launch(x2, [w], [out2])
        return out
    # Many rows: the dense GEMM on the weight dequantized into a K-major buffer ([N, K]
    # rows, the layout wgmma and the mma.sync tiles read fastest).
    wt = empty((w.n, w.k), a.dtype)
    _dequantize_launch(w, wt.T)
    matmul_fwd(op, x2, wt.T, out=out2)
    return out


def matmul_int4(a, w, *, out=None, dtype=None) -> DeviceArray:
    """Multiply float16 / bfloat16 activations by a packed 4-bit weight (W4A16).

    ``a`` [..., M, K] times ``w`` [K, N] (an :class:`Int4Weight`), float32 accumulation;
    the result [..., M, N] in ``a``'s dtype, or ``dtype`` / ``out``'s (float32, float16,
    bfloat16). Up to STREAM_MAX_M (128) rows stream the packed weight through the tensor
    cores once; more rows dequantize it once per call and run the dense matmul.

    Parameters
    ----------
    a : DeviceArray or array_like
        The activations [..., M, K]: float16 or bfloat16 (cast float32 ones first).
    w : Int4Weight
        The packed weight [K, N], on ``a``'s device.
    out : DeviceArray, optional
        A C-contiguous [..., M, N] array to write (float32, float16 or bfloat16).
    dtype : dtype, optional
        The result dtype: float32, float16 or bfloat16 (default: ``a``'s).

    Returns
    -------
    DeviceArray
        ``a @ w`` [..., M, N] (``out`` itself when given).

    Raises
    ------
    TypeError
        ``a`` that is not a float16 / bfloat16 array, ``w`` that is not an Int4Weight, an
        output dtype other than float32 / float16 / bfloat16, or an ``out`` that is not
        device memory.
    ValueError
        A 0-d ``a`` or one whose last dimension is not K, a weight on another device, or an
        ``out`` of another shape.

    Examples
    --------
    >>> w = kaionb.quantize_int4(np.full((256, 64), 7.0, np.float32))  # scale 1, code 15
    >>> a = kaionb.ones((2, 256), dtype=np.float16)
    >>> kaionb.matmul_int4(a, w).get()[0, :3].tolist()
    [1792.0, 1792.0, 1792.0]
    """
    return matmul_int4_fwd("matmul_int4", a, w, out=out, dtype=dtype)


@fast_path
def dequantize_int4_fwd(op: str, w, dtype=np.float16, *, out=None) -> DeviceArray:
    w = _check_weight(op, "w", w)
    dt = as_dtype(op, "dtype", dtype, _ACT_DTYPES, "float16 or bfloat16")
    out = output(op, out, w.shape, dt, device=w.device_id, layout=C_CONTIGUOUS)
    _dequantize_launch(w, out)
    return out


def dequantize_int4(w, dtype=np.float16, *, out=None) -> DeviceArray:
    """Unpack an :class:`Int4Weight` to a dense float16 (or bfloat16) [K, N] array.

    ``scale · (q - zero)`` rounded once, in the original row order — the values
    :func:`matmul_int4` multiplies by (bfloat16: with the scale rounded to bfloat16
    first).

    Parameters
    ----------
    w : Int4Weight
        The packed weight.
    dtype : dtype, optional
        The result dtype: float16 (default) or bfloat16.
    out : DeviceArray, optional
        A [K, N] array of ``dtype`` to write (any strides).

    Returns
    -------
    DeviceArray
        The dense weight (``out`` itself when given).

    Raises
    ------
    TypeError
        ``w`` that is not an Int4Weight, a dtype other than float16 / bfloat16, or an
        ``out`` that is not device memory or has another dtype.
    ValueError
        An ``out`` of another shape or on another device.

    Examples
    --------
    >>> w = kaionb.quantize_int4(np.full((128, 4), 3.5, np.float32))  # scale 0.5
    >>> kaionb.dequantize_int4(w, kaionb.bfloat16).astype(np.float32).get()[0]
    array([3.5, 3.5, 3.5, 3.5], dtype=float32)
    """
    return dequantize_int4_fwd("dequantize_int4", w, dtype, out=out)


def dequantize_int4_ref(w: Int4Weight, dtype=np.float16) -> np.ndarray:
    """Host reference of :func:`dequantize_int4` from the packed arrays (NumPy)."""
    q, scales, zeros, perm = _unpack(w)
    g = w.k if w.group_size == -1 else w.group_size
    rows = np.arange(w.k) // g
    s = scales.astype(np.float32)
    if np.dtype(dtype) == bfloat16:
        s = s.astype(ml_dtypes.bfloat16).astype(np.float32)
    z = 8 if zeros is None else zeros[rows].astype(np.float32)
    values = (s[rows] * (q.astype(np.float32) - z)).astype(dtype)  # exact, then one rounding
    if perm is not None:
        values = values[np.argsort(perm)]  # stored row i is original row perm[i]
    return values


def matmul_int4_ref(a, w: Int4Weight) -> np.ndarray:
    """float64 reference: ``a`` times the dequantized weight of ``a``'s dtype."""
    a = np.asarray(a)
    return np.matmul(a.astype(np.float64), dequantize_int4_ref(w, a.dtype).astype(np.float64))


# -- the fused QKV projection -----------------------------------------------------------------

@fast_path
def qkv_project_int4_fwd(op: str, x, w_q, w_k, w_v, *, out=None, dtype=None) -> tuple:
    """Validate every argument (before any launch) and run the three projections."""
    x = _activations(op, "x", x)
    hidden, rows_shape = x.shape[-1], x.shape[:-1]
    weights = []
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        w = _check_weight(op, name, w, x)
        if w.k != hidden:
            fail(ValueError, op, name, f"K = {hidden} (x is {x.shape}: its last dimension is "
                 "the hidden size)", f"shape {w.shape}")
        weights.append(w)
    if weights[2].n != weights[1].n:
        fail(ValueError, op, "w_v", f"N = {weights[1].n} (as w_k: K and V have one width)",
             f"shape {weights[2].shape}")
    widths = tuple(w.n for w in weights)
    outs = _qkv_outputs(op, out, rows_shape, widths, dtype, x)
    m = math.prod(rows_shape)
    if m == 0:
        return outs
    x2 = _rows(x)
    outs2 = [o.reshape(m, o.shape[-1]) for o in outs]
    if m <= STREAM_MAX_M:
        _stream_launch(x2, weights, outs2)
    else:
        for w, o in zip(weights, outs2):
            matmul_int4_fwd(op, x2, w, out=o)
    return outs


def qkv_project_int4(x, w_q, w_k, w_v, *, out=None, dtype=None) -> tuple:
    """Project activations to Q, K and V through three 4-bit weights in one launch (W4A16).

    The attention input projections of a W4A16 model, ``(x @ w_q, x @ w_k, x @ w_v)``:
    ``q [..., N_q], k [..., N_kv], v [..., N_kv]``.

    ``x`` float16 / bfloat16 [..., hidden]; ``w_q`` [hidden, N_q], ``w_k`` and ``w_v``
    [hidden, N_kv] :class:`Int4Weight` (GQA: N_kv may differ from N_q; each has its own
    group size, zero points and act order). Results in x's dtype or ``dtype``; ``out``: a
    tuple of three C-contiguous arrays. New results share one allocation. Above
    STREAM_MAX_M (128) rows: three :func:`matmul_int4` calls.

    Parameters
    ----------
    x : DeviceArray or array_like
        The activations [..., hidden]: float16 or bfloat16.
    w_q : Int4Weight
        [hidden, N_q].
    w_k, w_v : Int4Weight
        [hidden, N_kv] each (N_kv may differ from N_q: GQA).
    out : tuple of DeviceArray, optional
        Three C-contiguous arrays [..., N_q], [..., N_kv], [..., N_kv] of one dtype.
    dtype : dtype, optional
        The results' dtype: float32, float16 or bfloat16 (default: x's).

    Returns
    -------
    tuple of DeviceArray
        ``(q, k, v)`` (``out``'s arrays when given).

    Raises
    ------
    TypeError
        ``x`` that is not float16 / bfloat16, a weight that is not an Int4Weight, an
        ``out`` that is not a tuple of three device arrays, or a result dtype other than
        float32 / float16 / bfloat16.
    ValueError
        A weight whose K is not x's last dimension, ``w_k`` and ``w_v`` of different
        widths, weights on another device, or ``out`` arrays of other shapes.

    Examples
    --------
    >>> w_q = kaionb.quantize_int4(np.full((128, 32), 7.0, np.float32))
    >>> w_kv = kaionb.quantize_int4(np.full((128, 8), 7.0, np.float32))
    >>> x = kaionb.ones((1, 128), dtype=np.float16)
    >>> q, k, v = kaionb.qkv_project_int4(x, w_q, w_kv, w_kv)
    >>> q.shape, k.shape, v.shape
    ((1, 32), (1, 8), (1, 8))
    """
    return qkv_project_int4_fwd("qkv_project_int4", x, w_q, w_k, w_v, out=out, dtype=dtype)


def qkv_project_int4_ref(x, w_q, w_k, w_v) -> tuple:
    """float64 reference: :func:`matmul_int4_ref` per weight."""
    return tuple(matmul_int4_ref(x, w) for w in (w_q, w_k, w_v))
