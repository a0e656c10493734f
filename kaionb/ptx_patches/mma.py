"""Warp-level tensor-core ``mma.sync`` (sm_80+).

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-mma

Every instruction takes the warp's fragments as tuples of 32-bit registers and returns
the D fragment as a tuple: ``d = mma_m16n8k16_f32_f16(a, b, c)`` computes D = A·B + C
for A 16×K (row-major), B K×8 (column-major), C/D 16×8. Half, bf16, tf32 and s8 values
travel as bit patterns packed in uint32 (low half first). Which lane holds which element
is spelled out in :mod:`kaionb.kernels.helpers.fragments`.

These are pure register operations: no side effect, so the compiler may schedule them.
"""

from numba import types

from ._factory import ptx_instruction

_U32x2 = types.UniTuple(types.uint32, 2)
_U32x4 = types.UniTuple(types.uint32, 4)
_F32x4 = types.UniTuple(types.float32, 4)
_S32x4 = types.UniTuple(types.int32, 4)

mma_m16n8k16_f32_f16 = ptx_instruction(
    "mma_m16n8k16_f32_f16",
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
    outputs=_F32x4,
    inputs=(_U32x4, _U32x2, _F32x4),
    doc="``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: "
    "(a: 4×f16x2, b: 2×f16x2, c: 4×f32) -> d: 4×f32.",
)

mma_m16n8k16_f32_bf16 = ptx_instruction(
    "mma_m16n8k16_f32_bf16",
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
    outputs=_F32x4,
    inputs=(_U32x4, _U32x2, _F32x4),
    doc="``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``: "
    "(a: 4×bf16x2, b: 2×bf16x2, c: 4×f32) -> d: 4×f32.",
)

mma_m16n8k16_f16_f16 = ptx_instruction(
    "mma_m16n8k16_f16_f16",
    "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 "
    "{$0, $1}, {$2, $3, $4, $5}, {$6, $7}, {$8, $9};",
    outputs=_U32x2,
    inputs=(_U32x4, _U32x2, _U32x2),
    doc="``mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16``: "
    "(a: 4×f16x2, b: 2×f16x2, c: 2×f16x2) -> d: 2×f16x2 (f16 accumulate).",
)

mma_m16n8k32_s32_s8 = ptx_instruction(
    "mma_m16n8k32_s32_s8",
    "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
    outputs=_S32x4,
    inputs=(_U32x4, _U32x2, _S32x4),
    doc="``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32``: "
    "(a: 4×s8x4, b: 2×s8x4, c: 4×s32) -> d: 4×s32 (wrapping).",
)

mma_m16n8k8_f32_tf32 = ptx_instruction(
    "mma_m16n8k8_f32_tf32",
    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
    outputs=_F32x4,
    inputs=(_U32x4, _U32x2, _F32x4),
    doc="``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``: "
    "(a: 4×tf32, b: 2×tf32, c: 4×f32) -> d: 4×f32. tf32 operands are f32 bit "
    "patterns; the hardware ignores the low 13 mantissa bits.",
)
