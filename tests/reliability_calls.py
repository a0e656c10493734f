"""The reliability suite's table of calls (issue 20): small representative calls that
together launch every kernel kaionb registers (``kaionb.kernels.launch.all_kernels()``:
each kernel, and each kernel family's samples).

An entry is a :class:`Call`: ``make(rng)`` builds fresh random inputs on the device
(``kaionb.testing.random_array``, never zeros) and returns a function of no arguments that
runs the op once and returns its output array(s). That function may run again and gives
the same result: ops that update arrays in place (adamw_step, ``x[idx] = v``) start from
a copy of the inputs each time. ``runs_on(cc)`` says which GPUs the entry runs on.

Most entries go through the public API with shapes that select the variant; the mma.sync
matmul tiles and the wgmma tiles are forced with ``matmul_fwd``'s ``tile``/``loads``
arguments (as tests/test_matmul.py does); the elementwise and reduction entries are made
from their families' sample lists, so they follow those lists. Two kinds of variant no
public call on an H100 selects are reached on purpose, each entry saying how: the
pre-Hopper QKV prefill tiles (the dispatcher shown compute capability 8.9), and the
per-row quantization clusters of 2 and 4 CTAs (launched directly: ``cluster_row_plan``
never picks them, see :func:`_quantize_rows_cluster`).

Users: tests/gpu/sanitize_driver.py (compute-sanitizer), tests/test_determinism.py
(bit-identical repeats and processes), tests/test_reliability_table.py (on the CPU: the
table reaches every registered kernel).

    python tests/reliability_calls.py --hashes FILE [--shard I/N]  # {entry: sha256}, JSON
    python tests/reliability_calls.py --coverage     # launched N of M kernel variants; ...
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import zlib
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

import kaionb
from kaionb._device import STATE, compute_capability
from kaionb.array import DeviceArray, bfloat16
from kaionb.kernels import attention as at
from kaionb.kernels import elementwise as ew
from kaionb.kernels import launch
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_hopper as mh
from kaionb.kernels import matmul_int8 as mi8
from kaionb.kernels import norms
from kaionb.kernels import quantize as qz
from kaionb.kernels import reductions as red
from kaionb.kernels import softmax as softmax_kernels
from kaionb.kernels.helpers.rowwise import INT8, cluster_row_plan
from kaionb.kernels.op import Plan
from kaionb.testing import random_array
from row_cases import cluster_width

F16, F32, F64, BF16 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), bfloat16
I8, I32, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)
FLOATS = (F32, F16, BF16)
# (x or y dtype, gradient dtype): the backward kernels of the row-wise ops (the gradient in
# x's dtype or float32).
GRAD_PAIRS = ((F32, F32), (F16, F32), (F16, F16), (BF16, F32), (BF16, BF16))


def any_gpu(cc) -> bool:
    return True


def hopper(cc) -> bool:
    """wgmma / TMA kernels: sm_90a code, compute capability 9.0 only."""
    return cc == (9, 0)


def sm90_or_newer(cc) -> bool:
    """Thread-block clusters."""
    return cc >= (9, 0)


class Call(NamedTuple):
    name: str
    make: Callable  # rng -> (() -> output array or tuple of them)
    runs_on: Callable = any_gpu


# -- input helpers ---------------------------------------------------------------------------

def _dev(rng, shape, dtype=F32, scale=1.0) -> DeviceArray:
    return kaionb.asarray(random_array(shape, dtype, rng=rng, scale=scale))


def _positive(rng, shape, scale=1.0) -> DeviceArray:
    """float32 values > 0 (scales, AdamW's second moment)."""
    return kaionb.asarray(np.abs(random_array(shape, F32, rng=rng)) * np.float32(scale))


def _matrix(rng, shape, dtype, transposed=False) -> DeviceArray:
    """A [rows, cols] operand, stored row-major, or (``transposed``) as the ``.T`` view of
    a row-major [cols, rows] array."""
    if transposed:
        return _dev(rng, shape[::-1], dtype).T
    return _dev(rng, shape, dtype)


def _int8(rng, shape) -> DeviceArray:
    return _dev(rng, shape, I8)


def _misaligned_f32(shape) -> DeviceArray:
    """A C-contiguous float32 output 4 bytes past a 16-byte boundary: the Hopper kernels
    need aligned output rows, so the mma.sync path runs instead."""
    n = int(np.prod(shape))
    return kaionb.empty((n + 1,), F32)[1:].reshape(shape)


@contextlib.contextmanager
def _compute_capability_seen_as(module, cc):
    """Inside: ``module``'s dispatcher sees compute capability ``cc`` — a path the GPU
    itself never takes (its kernels are compiled for the real device all the same)."""
    real = module.compute_capability
    module.compute_capability = lambda: cc
    try:
        yield
    finally:
        module.compute_capability = real


# -- matmul ----------------------------------------------------------------------------------

_OPERAND_DTYPE = {"f16": F16, "bf16": BF16, "tf32": F32, "tf32x3": F32}
# M per forced tile class (the rows each class is made for); N = 72, K = 520 for all.
_MMA_M = {"decode16": 9, "decode64": 40, "small": 72, "large": 136}
# Forced split-K: 3 uneven splits on the small tile, none on the large one; the decode
# tiles split K themselves (K // 256 = 2 splits).
_MMA_SPLITS = {"small": 3, "large": 1}


def _layout(a_kmajor: bool, b_kmajor: bool) -> str:
    return ("n" if a_kmajor else "t") + ("t" if b_kmajor else "n")


def _matmul_mma(operand, a_kmajor, b_kmajor, loads, tile):
    """One mma.sync variant, forced (tile, pipeline); 16-bit results for the async
    pipeline, float32 for sync."""
    dtype = _OPERAND_DTYPE[operand]
    m, n, k = _MMA_M[tile], 72, 520
    kw = dict(loads=loads, tile=tile, splits=_MMA_SPLITS.get(tile),
              precision="tf32" if operand == "tf32" else "highest",
              dtype=dtype if loads == "async" else F32)

    def make(rng):
        a = _matrix(rng, (m, k), dtype, transposed=not a_kmajor)
        b = _matrix(rng, (k, n), dtype, transposed=b_kmajor)
        return lambda: mm.matmul_fwd("matmul", a, b, **kw)
    return make


def _matmul_wgmma(dtype, a_kmajor, b_kmajor, tile):
    """One Hopper variant, forced: 16-bit results for wide (staged TMA store) and the
    split tiles (K = 1000: the splits exchange halves of their partials in the cluster's
    shared memory and store from registers), float32 (stored from registers) for narrow.

    compute-sanitizer's initcheck does not count a TMA store (cp.async.bulk.tensor) as a
    write: reading back a wide result flagged every element (2026-11-26, H200, CUDA 13).
    So the wide and split entries write into an output poisoned with NaN before each call,
    and check that no NaN is left: every element written, which initcheck cannot see."""
    if tile == "narrow":
        def make(rng):
            a = _matrix(rng, (136, 200), dtype, transposed=not a_kmajor)
            b = _matrix(rng, (200, 264), dtype, transposed=b_kmajor)
            return lambda: mm.matmul_fwd("matmul", a, b, loads="wgmma", tile=tile, dtype=F32)
        return make

    split = tile in mh.SPLIT_TILES
    k = 1000 if split else 200

    def make_staged(rng):
        a = _matrix(rng, (136, k), dtype, transposed=not a_kmajor)
        b = _matrix(rng, (k, 264), dtype, transposed=b_kmajor)
        out = kaionb.empty((136, 264), dtype)

        def call():
            out.fill(np.nan)
            mm.matmul_fwd("matmul", a, b, loads="wgmma", tile=tile, out=out,
                          splits=2 if split else None)
            unwritten = int(np.isnan(out.get().astype(F32)).sum())
            if unwritten:
                raise AssertionError(f"{tile} wgmma matmul left {unwritten} elements unwritten")
            return out
        return call
    return make_staged


def _matmul_public(shape_a, shape_b, dtype, fn=kaionb.matmul):
    def make(rng):
        a, b = _dev(rng, shape_a, dtype), _dev(rng, shape_b, dtype)
        return lambda: fn(a, b)
    return make


def _matmul_calls():
    calls = []
    for (operand, a_k, b_k, loads, tile) in mm._KERNELS:
        if operand != "s8":  # int8 runs through matmul_int8 (below)
            calls.append(Call(f"matmul/{operand}-{_layout(a_k, b_k)}-{loads}-{tile}",
                              _matmul_mma(operand, a_k, b_k, loads, tile)))
    for (operand, a_k, b_k, tile) in mh._KERNELS:
        if operand != "s8":
            calls.append(Call(f"matmul/wgmma-{operand}-{_layout(a_k, b_k)}-{tile}",
                              _matmul_wgmma(_OPERAND_DTYPE[operand], a_k, b_k, tile), hopper))
    calls += [
        Call("matmul/batched-broadcast", _matmul_public((2, 3, 40, 64), (3, 64, 72), F16)),
        Call("matmul/batch-folds-into-rows", _matmul_public((4, 16, 64), (64, 72), BF16)),
        Call("matmul/vector-times-matrix", _matmul_public((136,), (136, 72), F32)),
        Call("matmul/batched-split-k", _matmul_public((2, 16, 1032), (2, 1032, 264), F16)),
        Call("matmul/matmul_tc", _matmul_public((40, 64), (64, 72), F16, kaionb.matmul_tc)),
    ]
    for dtype, name in ((F16, "f16"), (BF16, "bf16")):
        calls += [Call(f"matmul/stream8-{name}", _matmul_stream(5, 2048, 256, dtype)),
                  Call(f"matmul/stream16-{name}", _matmul_stream(12, 4096, 256, dtype)),
                  # 8 KiB of K: the variant that prefetches 256-byte blocks into L2.
                  Call(f"matmul/stream8-prefetch-{name}", _matmul_stream(1, 2048, 4096, dtype)),
                  Call(f"matmul/stream16-prefetch-{name}",
                       _matmul_stream(16, 4096, 4104, dtype))]
    return calls


def _matmul_stream(m, n, k, dtype):
    """``x @ w.T`` at decode size (M ≤ 16, the K-major view of a row-major [n, k] weight,
    ≥ 256 blocks: more than an H100's SMs): the weight stream."""
    def make(rng):
        x, w = _dev(rng, (m, k), dtype), _dev(rng, (n, k), dtype)
        return lambda: kaionb.matmul(x, w.T)
    return make


# -- int8 ------------------------------------------------------------------------------------

def _matmul_int8(m, n, k, *, vectors=False, bias=False, misaligned_out=False):
    """a int8 [m, k] @ the ``w.T`` view of an int8 [n, k] weight; per-tensor scale, or
    per-row and per-column scales (``vectors``) and a bias."""
    def make(rng):
        a, w = _int8(rng, (m, k)), _int8(rng, (n, k))
        scale = (_positive(rng, (m,), 1e-2), _positive(rng, (n,), 1e-2)) if vectors else 1e-3
        b = _dev(rng, (n,), F16) if bias else None
        out = _misaligned_f32((m, n)) if misaligned_out else None
        return lambda: kaionb.matmul_int8(a, w.T, scale, bias=b, out=out)
    return make


def _qkv_int8(m, hidden, widths, x_dtype=I8, seen_as=None):
    """qkv_project_int8 over K-major weights with per-channel scales; an int8 x comes with
    per-row scales, a float one is quantized per token. ``seen_as``: the compute capability
    the dispatcher is shown (the pre-Hopper prefill tiles on an H100)."""
    def make(rng):
        x = _dev(rng, (m, hidden), x_dtype)
        ws = [_int8(rng, (n, hidden)).T for n in widths]
        scales = [_positive(rng, (n,), 1e-3) for n in widths]
        x_scale = _positive(rng, (m,), 1e-2) if x_dtype == I8 else None

        def call():
            with (_compute_capability_seen_as(mi8, seen_as) if seen_as
                  else contextlib.nullcontext()):
                return kaionb.qkv_project_int8(x, *ws, *scales, x_scale=x_scale)
        return call
    return make


def _int8_calls():
    return [
        Call("matmul_int8/decode16-split-k", _matmul_int8(9, 72, 528)),
        Call("matmul_int8/decode64-split-k", _matmul_int8(40, 72, 528, vectors=True, bias=True)),
        Call("matmul_int8/async-small", _matmul_int8(100, 72, 128, vectors=True)),
        # 120 tiles of 128×256 fill an H100, which would run wgmma on an aligned output.
        Call("matmul_int8/async-large", _matmul_int8(1024, 3840, 128, misaligned_out=True)),
        Call("matmul_int8/sync-small-unaligned-k", _matmul_int8(100, 72, 40, bias=True)),
        Call("matmul_int8/sync-large-unaligned-k", _matmul_int8(1024, 1920, 40)),
        Call("matmul_int8/wgmma-wide", _matmul_int8(1024, 4096, 128), hopper),
        Call("matmul_int8/wgmma-narrow",
             _matmul_int8(1024, 1024, 128, vectors=True, bias=True), hopper),
        Call("qkv_project_int8/s8-decode16", _qkv_int8(9, 528, (64, 32, 32))),
        Call("qkv_project_int8/s8-decode64", _qkv_int8(40, 528, (64, 32, 32))),
        Call("qkv_project_int8/s8-async-small-pre-hopper",
             _qkv_int8(100, 128, (64, 32, 32), seen_as=(8, 9))),
        Call("qkv_project_int8/s8-async-large-pre-hopper",
             _qkv_int8(1024, 128, (1920, 960, 960), seen_as=(8, 9))),
        Call("qkv_project_int8/s8-sync-small-unaligned", _qkv_int8(40, 40, (64, 32, 32))),
        Call("qkv_project_int8/s8-sync-large-unaligned", _qkv_int8(40, 40, (7680, 3840, 3840))),
        Call("qkv_project_int8/f16-fused-quantize", _qkv_int8(2, 528, (64, 32, 32), F16)),
        Call("qkv_project_int8/bf16-fused-quantize", _qkv_int8(1, 528, (64, 32, 32), BF16)),
        Call("qkv_project_int8/f16-quantized-first", _qkv_int8(9, 528, (64, 32, 32), F16)),
        # Decode over ≥ 256 blocks of the weight stream (more than an H100's SMs).
        Call("matmul_int8/stream8", _matmul_int8(5, 4096, 256, vectors=True, bias=True)),
        Call("matmul_int8/stream16", _matmul_int8(12, 4096, 256)),
        Call("matmul_int8/stream8-prefetch", _matmul_int8(8, 2048, 8192)),
        Call("matmul_int8/stream16-prefetch",
             _matmul_int8(9, 4096, 8208, vectors=True, bias=True)),
        Call("qkv_project_int8/s8-stream8", _qkv_int8(3, 256, (2048, 1024, 1024))),
        Call("qkv_project_int8/s8-stream16", _qkv_int8(16, 256, (2048, 1024, 1024))),
        Call("qkv_project_int8/f16-stream-fused", _qkv_int8(1, 256, (2048, 1024, 1024), F16)),
        Call("qkv_project_int8/bf16-stream-fused", _qkv_int8(2, 256, (2048, 1024, 1024), BF16)),
        # Prefill on an H100: three wgmma GEMMs (64 narrow tiles each).
        Call("qkv_project_int8/prefill-three-wgmma", _qkv_int8(1024, 128, (1024,) * 3), hopper),
    ]


# -- int4 ------------------------------------------------------------------------------------

def _int4_weight(rng, k, n, *, group_size=128, symmetric=True, act_order=False):
    """An Int4Weight: quantized from a random float weight, or (``act_order``) packed from
    random codes, scales and zeros with GPTQ's act-order group index."""
    if not act_order:
        w = random_array((k, n), F32, rng=rng, scale=0.05)
        return kaionb.quantize_int4(w, group_size, symmetric)
    groups = k // group_size
    q = rng.integers(0, 16, (k, n))
    scales = np.abs(random_array((groups, n), F16, rng=rng)) * np.float16(0.01)
    zeros = None if symmetric else rng.integers(0, 17, (groups, n))
    g_idx = rng.permutation(np.arange(k) // group_size)
    return kaionb.pack_int4(q, scales, zeros, group_size=group_size, g_idx=g_idx)


def _matmul_int4(m, dtype, **weight):
    def make(rng):
        a, w = _dev(rng, (m, 256), dtype), _int4_weight(rng, 256, 200, **weight)
        return lambda: kaionb.matmul_int4(a, w)
    return make


def _dequantize_int4(dtype):
    def make(rng):
        w = _int4_weight(rng, 256, 200, symmetric=False, act_order=True)
        return lambda: kaionb.dequantize_int4(w, dtype)
    return make


def _qkv_int4(rng):
    x = _dev(rng, (9, 256), F16)
    ws = (_int4_weight(rng, 256, 128), _int4_weight(rng, 256, 64, group_size=64,
                                                    symmetric=False),
          _int4_weight(rng, 256, 64, act_order=True))
    return lambda: kaionb.qkv_project_int4(x, *ws)


def _pack_int4(rng):
    """The host packing (no kernel) and its upload."""
    q = rng.integers(0, 16, (256, 72))
    scales = np.abs(random_array((2, 72), F16, rng=rng))
    zeros = rng.integers(0, 17, (2, 72))

    def call():
        w = kaionb.pack_int4(q, scales, zeros, group_size=128)
        return w.qweight, w.scales, w.zeros
    return call


def _int4_calls():
    calls = []
    for dtype in (F16, BF16):
        for m, tile in ((9, "m16"), (24, "m32"), (100, "m64")):
            weight = dict(symmetric=tile != "m32", act_order=tile == "m64")
            calls.append(Call(f"matmul_int4/{dtype.name}-{tile}", _matmul_int4(m, dtype, **weight)))
        calls.append(Call(f"dequantize_int4/{dtype.name}", _dequantize_int4(dtype)))
    calls += [
        Call("matmul_int4/dense-dequantized", _matmul_int4(200, F16)),
        Call("qkv_project_int4/f16", _qkv_int4),
        Call("pack_int4/host", _pack_int4),
    ]
    return calls


# -- attention -------------------------------------------------------------------------------

def _attention(dtype, D, shapes, causal, prefer_wgmma=True):
    """attention_fwd on q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D]."""
    (q_shape, kv_shape) = shapes

    def make(rng):
        q = _dev(rng, q_shape + (D,), dtype)
        k, v = _dev(rng, kv_shape + (D,), dtype), _dev(rng, kv_shape + (D,), dtype)
        return lambda: at.attention_fwd(q, k, v, causal, None, True, prefer_wgmma=prefer_wgmma)
    return make


# Prefill: 40 queries against 72 keys (one split), or against 520 (the keys split, the
# splits merged by the combine kernel); decode: a GQA group of 4 heads × 2 queries in one
# m16 tile, 200 keys split.
_PREFILL = ((1, 2, 40), (1, 2, 72))
_PREFILL_SPLIT = ((1, 2, 40), (1, 2, 520))
_DECODE = ((1, 4, 2), (1, 1, 200))


def _attention_bwd(dtype, D, causal, grad_dtype):
    def make(rng):
        q = _dev(rng, (1, 4, 40, D), dtype)
        k, v = _dev(rng, (1, 2, 72, D), dtype), _dev(rng, (1, 2, 72, D), dtype)
        out, lse = kaionb.attention(q, k, v, causal=causal, return_lse=True)
        dout = _dev(rng, q.shape, dtype)
        return lambda: kaionb.attention_bwd(dout, q, k, v, out, lse, causal=causal,
                                            dtype=grad_dtype)
    return make


def _attention_2d(fn):
    def make(rng):
        q, k, v = (_dev(rng, (40, 64), F16) for _ in range(3))
        return lambda: fn(q, k, v, with_stats=True)
    return make


def _attention_calls():
    calls = []
    for operand, dtype in (("f16", F16), ("bf16", BF16)):
        causal = operand == "bf16"
        prefill = _PREFILL if causal else _PREFILL_SPLIT
        for dp in at.HEAD_DIMS:
            D = dp if operand == "f16" else dp - 8  # bf16: columns past D zero-filled
            calls.append(Call(f"attention/{operand}-d{dp}-prefill",
                              _attention(dtype, D, prefill, causal, prefer_wgmma=False)))
            calls.append(Call(f"attention/{operand}-d{dp}-decode",
                              _attention(dtype, D, _DECODE, not causal)))
            calls.append(Call(f"attention_bwd/{operand}-d{dp}",
                              _attention_bwd(dtype, D, not causal, None if causal else F32)))
        for dp in at.WGMMA_TILES:
            calls.append(Call(f"attention/{operand}-d{dp}-wgmma",
                              _attention(dtype, dp, prefill, causal), hopper))
    calls += [
        Call("attention/f32-inputs-on-bf16", _attention(F32, 64, _PREFILL_SPLIT, False)),
        Call("attention/attention_tc", _attention_2d(kaionb.attention_tc)),
        Call("attention/attention_flash_causal", _attention_2d(kaionb.attention_flash_causal)),
    ]
    return calls


# -- row-wise primitives ---------------------------------------------------------------------

# Rows of 256 stay in registers; rows of 77 (misaligned) take the streaming path.
_ROW_PATHS = (("registers", 256), ("streaming", 77))


def _norm(op, dtype, n):
    def make(rng):
        x, w = _dev(rng, (64, n), dtype), _dev(rng, (n,), dtype)
        if op == "layer_norm":
            b = _dev(rng, (n,), dtype)
            return lambda: kaionb.layer_norm(x, w, b)
        if op == "add_rms_norm":
            r = _dev(rng, (64, n), dtype)
            return lambda: kaionb.add_rms_norm(x, r, w)
        return lambda: kaionb.rms_norm(x, w)
    return make


def _norm_bwd(op, dtype, grad_dtype, n):
    """64 rows: several blocks, their partial weight gradients summed by a reduction."""
    def make(rng):
        g, x, w = _dev(rng, (64, n), grad_dtype), _dev(rng, (64, n), dtype), _dev(rng, (n,), dtype)
        if op == "layer_norm_bwd":
            b = _dev(rng, (n,), dtype)
            return lambda: kaionb.layer_norm_bwd(g, x, w, b)
        if op == "add_rms_norm_bwd":
            g_res = _dev(rng, (64, n), grad_dtype)
            return lambda: kaionb.add_rms_norm_bwd(g, g_res, x, w)
        return lambda: kaionb.rms_norm_bwd(g, x, w)
    return make


def _softmax(dtype, shape, axis, grad_dtype=None):
    """softmax along ``axis`` (0 of a C-contiguous array: the column kernels), or its
    backward with a gradient of ``grad_dtype``."""
    def make(rng):
        x = _dev(rng, shape, dtype)
        if grad_dtype is None:
            return lambda: kaionb.softmax(x, axis=axis)
        y, g = kaionb.softmax(x, axis=axis), _dev(rng, shape, grad_dtype)
        return lambda: kaionb.softmax_bwd(g, y, axis=axis)
    return make


def _activation(op, dtype, grad_dtype=None, approximate="none"):
    """[8, 200] forward (aligned rows), [5, 67] backward (misaligned: the element path)."""
    shape = (8, 200) if grad_dtype is None else (5, 67)

    def make(rng):
        x, other = _dev(rng, shape, dtype), _dev(rng, shape, dtype)
        g = None if grad_dtype is None else _dev(rng, shape, grad_dtype)
        if op == "fused_silu_gate":
            return lambda: kaionb.fused_silu_gate(x, other)
        if op == "fused_silu_gate_bwd":
            return lambda: kaionb.fused_silu_gate_bwd(g, x, other)
        if op == "gelu":
            return lambda: kaionb.gelu(x, approximate)
        return lambda: kaionb.gelu_bwd(g, x, approximate)
    return make


def _rope(dtype, interleaved):
    """NeoX pairs on [B, S, H, D] from position 0; GPT-J pairs on [B, H, S, D] at host
    positions with a partial rotary part (R = 32 of D = 64)."""
    def make(rng):
        if not interleaved:
            x = _dev(rng, (2, 16, 4, 64), dtype)
            cos, sin = kaionb.rope_cache(16, 64)
            return lambda: kaionb.rope(x, cos, sin)
        x = _dev(rng, (2, 4, 16, 64), dtype)
        cos, sin = kaionb.rope_cache(40, 32)
        positions = np.arange(16, dtype=np.int64) + 7
        return lambda: kaionb.rope(x, cos, sin, positions=positions, interleaved=True,
                                   layout="bhsd")
    return make


def _rope_bwd(rng):
    g = _dev(rng, (2, 16, 4, 64), F32)
    cos, sin = kaionb.rope_cache(16, 64)
    return lambda: kaionb.rope_bwd(g, cos, sin)


def _rowwise_calls():
    calls = []
    for dtype in FLOATS:
        for op in ("rms_norm", "layer_norm", "add_rms_norm"):
            for path, n in _ROW_PATHS:
                calls.append(Call(f"{op}/{dtype.name}-{path}", _norm(op, dtype, n)))
            # Wider than one CTA holds: the row over a cluster of each size.
            for size in norms._CLUSTER_KERNELS.get((op, dtype), ()):
                calls.append(Call(f"{op}/{dtype.name}-cluster{size}",
                                  _norm(op, dtype, cluster_width(dtype, size, op)),
                                  sm90_or_newer))
        for size in softmax_kernels._ROW_CLUSTER_KERNELS.get(dtype, ()):
            calls.append(Call(f"softmax/rows-cluster{size}-{dtype.name}",
                              _softmax(dtype, (64, cluster_width(dtype, size, "softmax")), -1),
                              sm90_or_newer))
        calls.append(Call(f"softmax/rows-{dtype.name}", _softmax(dtype, (64, 256), -1)))
        calls.append(Call(f"softmax/rows-streaming-{dtype.name}", _softmax(dtype, (8, 77), -1)))
        calls.append(Call(f"softmax/columns-vector-{dtype.name}", _softmax(dtype, (64, 24), 0)))
        calls.append(Call(f"softmax/columns-element-{dtype.name}", _softmax(dtype, (64, 13), 0)))
        calls.append(Call(f"fused_silu_gate/{dtype.name}", _activation("fused_silu_gate", dtype)))
        for approximate in ("none", "tanh"):
            calls.append(Call(f"gelu/{approximate}-{dtype.name}",
                              _activation("gelu", dtype, approximate=approximate)))
        for interleaved in (False, True):
            calls.append(Call(f"rope/{'gptj' if interleaved else 'neox'}-{dtype.name}",
                              _rope(dtype, interleaved)))
    for dtype, grad_dtype in GRAD_PAIRS:
        pair = f"{dtype.name}-grad-{grad_dtype.name}"
        for op in ("rms_norm_bwd", "layer_norm_bwd"):
            for path, n in _ROW_PATHS:
                calls.append(Call(f"{op}/{pair}-{path}", _norm_bwd(op, dtype, grad_dtype, n)))
            # Wider than one CTA holds: the row over a cluster of 8 CTAs.
            calls.append(Call(f"{op}/{pair}-cluster", _norm_bwd(op, dtype, grad_dtype, 32768),
                              sm90_or_newer))
            # x, g and the dw accumulators in shared memory: one CTA (9216 elements fit
            # an A100's too), and a cluster of 16 CTAs.
            calls.append(Call(f"{op}/{pair}-shared", _norm_bwd(op, dtype, grad_dtype, 9216)))
            calls.append(Call(f"{op}/{pair}-cluster16",
                              _norm_bwd(op, dtype, grad_dtype, 131072), sm90_or_newer))
        calls.append(Call(f"softmax_bwd/rows-{pair}", _softmax(dtype, (64, 256), -1, grad_dtype)))
        calls.append(Call(f"softmax_bwd/columns-vector-{pair}",
                          _softmax(dtype, (64, 24), 0, grad_dtype)))
        calls.append(Call(f"softmax_bwd/columns-element-{pair}",
                          _softmax(dtype, (64, 13), 0, grad_dtype)))
        calls.append(Call(f"fused_silu_gate_bwd/{pair}",
                          _activation("fused_silu_gate_bwd", dtype, grad_dtype)))
        for approximate in ("none", "tanh"):
            calls.append(Call(f"gelu_bwd/{approximate}-{pair}",
                              _activation("gelu_bwd", dtype, grad_dtype, approximate)))
    calls += [
        Call("add_rms_norm_bwd/f16-grad-f32", _norm_bwd("add_rms_norm_bwd", F16, F32, 256)),
        Call("add_rms_norm_bwd/bf16-streaming", _norm_bwd("add_rms_norm_bwd", BF16, BF16, 77)),
        Call("rope_bwd/neox-f32", _rope_bwd),
    ]
    return calls


# -- quantize --------------------------------------------------------------------------------

def _quantize(dtype, shape, axis):
    def make(rng):
        x = _dev(rng, shape, dtype)
        return lambda: kaionb.quantize_int8(x, axis=axis)
    return make


def _dequantize(dtype, axis, shape=(64, 200)):
    def make(rng):
        q = _int8(rng, shape)
        scale_shape = {None: (), -1: shape[1:], 0: shape[:1]}[axis]
        scale = _positive(rng, scale_shape, 1e-2)
        return lambda: kaionb.dequantize_int8(q, scale, axis=axis, dtype=dtype)
    return make


def _quantize_rows_cluster(size, dtype):
    """The per-row quantization kernel over a cluster of ``size`` CTAs, launched as
    quantize.py's cluster branch launches it. No call selects sizes 2 and 4: that branch
    runs only for rows one block cannot hold (over 1024 threads × 2 words4), and for those
    ``rowwise.cluster_row_plan`` always picks 8 (it stops doubling at 256 threads a CTA)."""
    n = size * 512 * INT8.vec  # the rows cluster_row_plan gives ``size`` CTAs of 256

    def make(rng):
        x = _dev(rng, (2, n), dtype)
        q, scale = kaionb.empty((2, n), I8), kaionb.empty((2,), F32)
        picked, threads = cluster_row_plan(n // INT8.vec, INT8.reg_vecs)
        if picked != size:
            raise RuntimeError(f"cluster_row_plan now picks {picked} CTAs for {n} elements")
        plan = Plan.of(qz._CLUSTER_KERNELS[size, dtype], (2 * size,), (threads,),
                       cluster=(size, 1, 1))

        def call():
            plan.launch(x, q, scale, n)
            return q, scale
        return call
    return make


def _quantize_calls():
    calls = []
    for dtype in FLOATS:
        name = dtype.name
        calls += [
            Call(f"quantize_int8/tensor-{name}", _quantize(dtype, (64, 200), None)),
            Call(f"quantize_int8/columns-{name}", _quantize(dtype, (64, 200), -1)),
            Call(f"quantize_int8/rows-one-block-{name}", _quantize(dtype, (64, 256), 0)),
            # 65536-element rows: one cluster of 8 CTAs each (sm_90).
            Call(f"quantize_int8/rows-cluster8-{name}", _quantize(dtype, (2, 65536), 0),
                 sm90_or_newer),
            Call(f"quantize_int8/rows-cluster2-direct-{name}", _quantize_rows_cluster(2, dtype),
                 sm90_or_newer),
            Call(f"quantize_int8/rows-cluster4-direct-{name}", _quantize_rows_cluster(4, dtype),
                 sm90_or_newer),
            Call(f"dequantize_int8/columns-{name}", _dequantize(dtype, -1)),
            # Rows of a multiple of 16 elements: walked end to end as one row.
            Call(f"quantize_int8/columns-flat-{name}", _quantize(dtype, (64, 208), -1)),
            Call(f"dequantize_int8/rows-flat-{name}", _dequantize(dtype, 0, (64, 208))),
            Call(f"dequantize_int8/columns-flat-{name}", _dequantize(dtype, -1, (64, 208))),
        ]
    calls += [
        Call("quantize_int8/rows-misaligned-f16", _quantize(F16, (64, 77), 0)),
        Call("dequantize_int8/tensor-bfloat16", _dequantize(BF16, None)),
        Call("dequantize_int8/rows-float32", _dequantize(F32, 0)),
    ]
    return calls


# -- optimizer, random, creation, indexing ---------------------------------------------------

def _adamw(grad_dtype, model_dtype, offset=0):
    """One AdamW step from fresh copies of the state (the step updates them in place);
    ``offset`` elements off 16-byte alignment: the element path."""
    n = 1000

    def make(rng):
        def state(fill):
            buf = kaionb.empty((n + offset,), F32)
            buf[offset:] = fill
            return buf[offset:]
        p0, m0, v0 = _dev(rng, (n,)), _dev(rng, (n,), scale=0.1), _positive(rng, (n,), 0.01)
        g = _dev(rng, (n,), grad_dtype)

        def call():
            p, m, v = state(p0), state(m0), state(v0)
            model = None if model_dtype is None else kaionb.empty((n,), model_dtype)
            kaionb.adamw_step(p, g, m, v, lr=1e-3, step=3, model_param=model)
            return (p, m, v) if model is None else (p, m, v, model)
        return call
    return make


def _random(method, dtype, **kw):
    """A draw from a generator seeded anew on each call (the same numbers every time)."""
    def make(rng):
        generator_seed = int(rng.integers(2**32))
        return lambda: getattr(kaionb.random.default_rng(generator_seed), method)(
            size=(1000,), dtype=dtype, **kw)
    return make


def _creation(fn, *args, **kwargs):
    """A creation function's call (no inputs)."""
    return lambda rng: lambda: fn(*args, **kwargs)


def _arange(dtype):
    if dtype.kind == "i":
        return _creation(kaionb.arange, -50, 50, dtype=dtype)
    if dtype.kind == "u":
        return _creation(kaionb.arange, 100, dtype=dtype)
    return _creation(kaionb.arange, -1.5, 2.5, 0.03, dtype=dtype)


def _concatenate(rng):
    a, b = _dev(rng, (8, 33)), _dev(rng, (33, 5), F16)
    return lambda: kaionb.concatenate([a, b.T], axis=0)


def _stack(rng):
    a, b = _dev(rng, (40,), I32), _dev(rng, (40,), I32)
    return lambda: kaionb.stack([a, b], axis=1)


def _take(dtype, index_dtype):
    """Gather along axis 1 at device indices (negative ones count from the end)."""
    def make(rng):
        x = _dev(rng, (16, 50, 8), dtype)
        idx = kaionb.asarray(rng.integers(-50, 50, 30).astype(index_dtype))
        return lambda: kaionb.take(x, idx, axis=1)
    return make


def _scatter(dtype, index_dtype):
    """``y[idx] = values`` on a fresh copy, distinct indices (with repeats, which value
    lands is unspecified: not deterministic by design)."""
    def make(rng):
        x = _dev(rng, (50, 8), dtype)
        idx = kaionb.asarray(rng.permutation(50)[:30].astype(index_dtype))
        values = _dev(rng, (30, 8), dtype)

        def call():
            y = x.copy()
            y[idx] = values
            return y
        return call
    return make


def _boolean_mask(rng):
    x = _dev(rng, (16, 50))
    mask = rng.random((16, 50)) < 0.5  # host mask: the indices are found on the host
    return lambda: x[mask]


def _astype(shape, src, dst, transposed=False):
    def make(rng):
        x = _dev(rng, shape, src)
        x = x.T if transposed else x
        return lambda: x.astype(dst)
    return make


def _misc_calls():
    calls = []
    for grad_dtype in FLOATS:
        for model_dtype in (None, F16, BF16):
            name = f"{grad_dtype.name}-model-{model_dtype.name if model_dtype else 'none'}"
            calls.append(Call(f"adamw_step/{name}", _adamw(grad_dtype, model_dtype)))
    calls.append(Call("adamw_step/misaligned", _adamw(F32, BF16, offset=1)))
    for dtype in (F64, F32, F16, BF16):
        calls.append(Call(f"random/uniform-{dtype.name}", _random("uniform", dtype, low=-2.0)))
        calls.append(Call(f"random/normal-{dtype.name}", _random("standard_normal", dtype)))
    for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "bool"):
        high = 2 if dtype == "bool" else 100
        calls.append(Call(f"random/integers-{dtype}", _random("integers", dtype, low=0,
                                                              high=high)))
    for dtype in (F64, F32, F16, BF16, "int64", "uint64", "int32", "uint32", "int16", "uint16",
                  "int8", "uint8"):
        dtype = np.dtype(dtype)
        calls.append(Call(f"arange/{dtype.name}", _arange(dtype)))
    calls += [
        Call("linspace/float32", _creation(kaionb.linspace, -1.0, 3.0, 257, dtype=F32)),
        Call("linspace/int32-through-float64", _creation(kaionb.linspace, 0, 1000, 77,
                                                         dtype=I32)),
        Call("eye/float32-offset-diagonal", _creation(kaionb.eye, 33, 40, k=2, dtype=F32)),
        Call("concatenate/mixed-dtypes-and-layouts", _concatenate),
        Call("stack/int32-axis1", _stack),
        Call("getitem/boolean-mask", _boolean_mask),
        Call("astype/float32-to-bfloat16", _astype((64, 33), F32, BF16)),
        Call("astype/strided-int8-to-float16", _astype((33, 64), I8, F16, transposed=True)),
    ]
    for dtype in (np.dtype(np.uint8), F16, F32, F64):  # element sizes 1, 2, 4, 8
        for index_dtype in (I64, I32):
            pair = f"{dtype.name}-by-{index_dtype.name}"
            calls.append(Call(f"take/{pair}", _take(dtype, index_dtype)))
            calls.append(Call(f"setitem/{pair}", _scatter(dtype, index_dtype)))
    return calls


# -- kernel families: elementwise and reductions, from their sample lists --------------------

def _scalar(loop):
    """A Python scalar computed in loop dtype ``loop``."""
    return {"f": 0.75, "i": 3, "u": 3, "b": True}[ew._kind(loop)]


def _elementwise(key):
    """The call that runs the kernel of ``key``: arrays of its operand dtypes (1-D of 263
    elements for the vector layout — a partial last words4 —, 1-D starting one element
    into an allocation for the flat one, [8, 64] slices of [8, 128] for the rows one,
    transposed [33, 8] views for the strided one, [40, 36] with its staged operands
    transposed views for the tiled one), scalars in its scalar slots."""
    nin = ew.UFUNCS[key.op].nin
    shape = {"vector": (263,), "flat": (264,), "rows": (8, 128), "strided": (8, 33),
             "tiled": (40, 36)}[key.layout]

    def make(rng):
        operands = []
        for i, (src, loop) in enumerate(zip(key.operands[:nin], key.loops[:nin])):
            if src is not None:
                x = _dev(rng, shape, src)
                if key.layout == "flat":
                    x = x[1:]  # off 16-byte alignment: not the vector layout
                elif key.layout == "rows":
                    x = x[:, :64]  # rows 128 elements apart: two axes that do not merge
                elif key.layout == "strided":
                    x = x.T
                elif key.layout == "tiled" and key.staged[i]:  # a transposed view
                    x = _dev(rng, shape[::-1], src).T
                operands.append(x)
            elif key.op == "clip":
                operands.append((-0.5, 0.5)[i - 1])  # the bounds
            else:
                operands.append(_scalar(loop))
        kw = {"dtype": key.out} if key.op == "copy" else {}
        return lambda: ew.elementwise_fwd(key.op, *operands, **kw)
    return make


def _elementwise_calls():
    samples = ew._samples()  # makes them: the factory's cache then maps key -> kernel
    keys = {id(kdef): key for key, kdef in ew._KERNELS.items()}
    return [Call("elementwise/" + kdef.name.removeprefix("_elementwise_").removesuffix("_kernel"),
                 _elementwise(keys[id(kdef)])) for kdef in samples]


# Shapes per reduction stage: rows reduce the last axis, columns axis 0; two-stage shapes
# are long enough for the split (R ≥ 2 chunks of the largest minimum chunk).
# Columns: 7 wide, never whole 16-byte words (the scalar col kernel); colv 32 wide, whole
# words for every dtype; flat: one contiguous row with a scalar tail.
_REDUCE_SHAPES = {("row", False): ((8, 512), -1), ("row", True): ((2, 65536), -1),
                  ("flat", True): (((1 << 20) + 5,), None),
                  ("col", False): ((64, 7), 0), ("col", True): ((4096, 7), 0),
                  ("colv", False): ((64, 32), 0), ("colv", True): ((4096, 32), 0)}


def _reduction(op, dtype, stage, two_stage):
    shape, axis = _REDUCE_SHAPES[stage, two_stage]

    def make(rng):
        x = _dev(rng, shape, dtype)
        return lambda: getattr(kaionb, op)(x, axis=axis)
    return make


def _reduction_calls():
    """One call per sample; a two-stage call runs both its partial and merge kernels, so a
    sample list naming both gets one entry."""
    calls = {}
    for op, name, variant in red._SAMPLES:
        stage, _, part = variant.partition("_")
        label = f"reduction/{op}-{name}-{stage}" + ("-two-stage" if part else "")
        calls.setdefault(label, Call(label, _reduction(
            op, BF16 if name == "bfloat16" else np.dtype(name), stage, bool(part))))
    return list(calls.values())


# -- the table -------------------------------------------------------------------------------

def calls() -> list[Call]:
    """Every entry, in a fixed order (shards and hashes rely on it)."""
    table = (_matmul_calls() + _int8_calls() + _int4_calls() + _attention_calls()
             + _rowwise_calls() + _quantize_calls() + _misc_calls() + _elementwise_calls()
             + _reduction_calls())
    names = [c.name for c in table]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AssertionError(f"reliability table: duplicate names {duplicates}")
    return table


def shard(entries: list, spec: str) -> list:
    """Entries I, I + N, ... for ``spec`` "I/N" (a mix of every area in each shard)."""
    index, count = (int(x) for x in spec.split("/"))
    return entries[index::count]


def seed(name: str) -> int:
    """The fixed seed of an entry's inputs (the same in every process)."""
    return zlib.crc32(name.encode())


def arrays(result) -> list[DeviceArray]:
    """An entry's output arrays, in order (None entries dropped)."""
    if isinstance(result, DeviceArray):
        return [result]
    return [a for a in result if a is not None]


def digest(result) -> str:
    """sha256 over each output's dtype, shape and bytes."""
    h = hashlib.sha256()
    for a in arrays(result):
        host = a.get()
        h.update(f"{host.dtype.str}{host.shape}".encode())
        h.update(np.ascontiguousarray(host).tobytes())
    return h.hexdigest()


# -- coverage --------------------------------------------------------------------------------

@contextlib.contextmanager
def recorded_launches():
    """Inside: every kernel launch is noted as (kernel name, specialization) in the set
    yielded. Recorded calls that the op fast path replays launch without
    CompiledKernel.__call__: :func:`run_entry` clears the replays first."""
    launched = set()
    real = launch.CompiledKernel.__call__

    def call(self, *args, **kwargs):
        launched.add((self.kdef.name, self.signature))
        return real(self, *args, **kwargs)

    launch.CompiledKernel.__call__ = call
    try:
        yield launched
    finally:
        launch.CompiledKernel.__call__ = real


def run_entry(entry: Call, *, fresh=True):
    """Build ``entry``'s inputs (seeded by its name) and run it once; returns the result.
    ``fresh``: forget the op fast path's recorded calls first, so that every launch of
    this entry goes through CompiledKernel.__call__ (where coverage is recorded)."""
    if fresh:
        STATE.calls = None
    fn = entry.make(np.random.default_rng(seed(entry.name)))
    return fn()


class Coverage(NamedTuple):
    covered: set  # (name, specialization) launched
    not_covered: set  # registered, runnable here, never launched
    cannot_run: set  # registered, not for this GPU (sm_90a-only, clusters, ...)

    def summary(self) -> str:
        total = len(self.covered) + len(self.not_covered) + len(self.cannot_run)
        lines = [f"launched {len(self.covered)} of {total} kernel variants"]
        if self.not_covered:
            lines.append("not reached: " + ", ".join(sorted(n for n, _ in self.not_covered)))
        if self.cannot_run:
            lines.append("cannot run on this GPU: "
                         + ", ".join(sorted(n for n, _ in self.cannot_run)))
        return "; ".join(lines)


def registered() -> dict:
    """{(kernel name, specialization): KernelDef} of every registered kernel and family
    sample (launch.all_kernels())."""
    return {(k.name, sig): k for k in launch.all_kernels() for sig in k.signatures}


def runs_on_device(kdef, cc) -> bool:
    """Whether ``kdef`` can run on compute capability ``cc``: sm_90a code on 9.0 only."""
    return cc == kdef.min_cc if kdef.arch_specific else cc >= kdef.min_cc


def coverage(launched, cc) -> Coverage:
    """Launched vs registered: the registered variants launched, those not launched
    though they could run on compute capability ``cc``, and those that cannot run there
    (family members made on use that are not samples are left out)."""
    kernels = registered()
    missing = set(kernels) - set(launched)
    cannot = {key for key in missing if not runs_on_device(kernels[key], cc)}
    return Coverage(set(launched) & set(kernels), missing - cannot, cannot)


def main(argv) -> int:
    parser = argparse.ArgumentParser(description="Run the reliability table on this GPU.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--hashes", metavar="FILE",
                      help="write {entry: sha256 of its outputs} as JSON (fixed seeds)")
    what.add_argument("--coverage", action="store_true",
                      help="print: launched N of M kernel variants; not reached: ...")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="only entries I, I + N, I + 2N, ...")
    args = parser.parse_args(argv)
    cc = compute_capability()
    entries = [c for c in shard(calls(), args.shard) if c.runs_on(cc)]
    if args.hashes:
        hashes = {c.name: digest(run_entry(c, fresh=False)) for c in entries}
        Path(args.hashes).write_text(json.dumps(hashes, indent=1, sort_keys=True))
        return 0
    with recorded_launches() as launched:
        for c in entries:
            run_entry(c)
    print(coverage(launched, cc).summary())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
