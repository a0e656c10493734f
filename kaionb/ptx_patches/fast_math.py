"""Approximate transcendental functions and packed half FMA.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#floating-point-instructions
(``ex2``, ``tanh``, ``rcp``, ``rsqrt``) and the half-precision section (``fma.rn.f16x2``).

``.approx.ftz``: single MUFU instructions, about 2 ulp (ex2 ~2 ulp, rcp/rsqrt ~1 ulp,
tanh ~2^-11 relative error), subnormal inputs and outputs flushed to zero.
"""

from numba import types

from ._factory import ptx_instruction

ex2_approx_f32 = ptx_instruction(
    "ex2_approx_f32",
    "ex2.approx.ftz.f32 $0, $1;",
    outputs=types.float32,
    inputs=(types.float32,),
    doc="``ex2.approx.ftz.f32``: 2**x.",
)

tanh_approx_f32 = ptx_instruction(
    "tanh_approx_f32",
    "tanh.approx.f32 $0, $1;",
    outputs=types.float32,
    inputs=(types.float32,),
    doc="``tanh.approx.f32``: tanh(x), max relative error about 2**-11.",
)

rcp_approx_f32 = ptx_instruction(
    "rcp_approx_f32",
    "rcp.approx.ftz.f32 $0, $1;",
    outputs=types.float32,
    inputs=(types.float32,),
    doc="``rcp.approx.ftz.f32``: 1/x.",
)

rsqrt_approx_f32 = ptx_instruction(
    "rsqrt_approx_f32",
    "rsqrt.approx.ftz.f32 $0, $1;",
    outputs=types.float32,
    inputs=(types.float32,),
    doc="``rsqrt.approx.ftz.f32``: 1/sqrt(x).",
)

fma_rn_f16x2 = ptx_instruction(
    "fma_rn_f16x2",
    "fma.rn.f16x2 $0, $1, $2, $3;",
    outputs=types.uint32,
    inputs=(types.uint32, types.uint32, types.uint32),
    doc="``fma.rn.f16x2``: a·b + c on two packed halves, one rounding.",
)

fma_rn_bf16x2 = ptx_instruction(
    "fma_rn_bf16x2",
    "fma.rn.bf16x2 $0, $1, $2, $3;",
    outputs=types.uint32,
    inputs=(types.uint32, types.uint32, types.uint32),
    doc="``fma.rn.bf16x2``: a·b + c on two packed bf16, one rounding.",
)
