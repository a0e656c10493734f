"""Conversions and bit packing: f32 ↔ f16x2/bf16x2, s8 → f16, INT4 → f16x2 / bf16x2, prmt,
lop3.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt
(and ``prmt``, ``lop3``, ``fma.rn.f16x2`` in the integer / half-precision sections).

Half-precision values are bit patterns (uint16, or two packed in a uint32 with the lower
element in the low 16 bits): numba's own fp16 arithmetic goes through an NVRTC shim.
"""

from numba import types

from ._factory import IMM, ptx_instruction

_U32x4 = types.UniTuple(types.uint32, 4)
_F32x2 = types.UniTuple(types.float32, 2)

cvt_rn_f16x2_f32 = ptx_instruction(
    "cvt_rn_f16x2_f32",
    "cvt.rn.f16x2.f32 $0, $2, $1;",
    outputs=types.uint32,
    inputs=(types.float32, types.float32),
    doc="``cvt.rn.f16x2.f32``: (lo: f32, hi: f32) -> f16x2, round to nearest even; "
    "``lo`` lands in the low 16 bits.",
)

cvt_rn_bf16x2_f32 = ptx_instruction(
    "cvt_rn_bf16x2_f32",
    "cvt.rn.bf16x2.f32 $0, $2, $1;",
    outputs=types.uint32,
    inputs=(types.float32, types.float32),
    doc="``cvt.rn.bf16x2.f32``: (lo: f32, hi: f32) -> bf16x2, round to nearest even.",
)

f16x2_to_f32x2 = ptx_instruction(
    "f16x2_to_f32x2",
    "{ .reg .f16 lo, hi; mov.b32 {lo, hi}, $2; "
    "cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
    outputs=_F32x2,
    inputs=(types.uint32,),
    instruction="cvt.f32.f16",
    doc="``mov.b32 {lo, hi}`` + ``cvt.f32.f16`` ×2: f16x2 -> (lo: f32, hi: f32), exact.",
)

bf16x2_to_f32x2 = ptx_instruction(
    "bf16x2_to_f32x2",
    "{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }",
    outputs=_F32x2,
    inputs=(types.uint32,),
    instruction="shl.b32/and.b32",
    doc="``shl.b32`` + ``and.b32``: bf16x2 -> (lo: f32, hi: f32), exact (a bf16 is the "
    "top half of an f32).",
)

cvt_rn_f16_s8 = ptx_instruction(
    "cvt_rn_f16_s8",
    "cvt.rn.f16.s8 $0, $1;",
    outputs=types.uint16,
    inputs=(types.int16,),
    doc="``cvt.rn.f16.s8``: the low byte of the input, as a signed 8-bit integer, -> "
    "f16 bits (uint16), exact.",
)

prmt_b32 = ptx_instruction(
    "prmt_b32",
    "prmt.b32 $0, $1, $2, $3;",
    outputs=types.uint32,
    inputs=(types.uint32, types.uint32, types.uint32),
    doc="``prmt.b32 d, a, b, sel``: byte permute; nibble i of ``sel`` picks byte i of d "
    "from the 8 bytes {b, a} (0-3 from a, 4-7 from b).",
)

lop3_b32 = ptx_instruction(
    "lop3_b32",
    "lop3.b32 $0, $1, $2, $3, $4;",
    outputs=types.uint32,
    inputs=(types.uint32, types.uint32, types.uint32, IMM),
    doc="``lop3.b32 d, a, b, c, lut``: any 3-input bitwise function in one instruction; "
    "``lut`` (a constant) is the function applied to 0xF0, 0xCC, 0xAA.",
)

# INT4 -> f16: a nibble n placed in the low 10 mantissa bits of 0x6400 (1024.0) reads as
# the f16 1024 + n; one fma then subtracts the bias. Signed nibbles are biased first by
# flipping bit 3 (n ^ 8 = n + 8 for n in -8..7). Per output pair j (weights 2j, 2j+1 in
# byte j): prmt copies byte j into bytes 0 and 2, lop3 keeps the low nibble of byte 0 and
# the high nibble of byte 2 and ORs in 0x6400 (giving 1024 + u and 1024 + 16·u'), and
# fma.rn.f16x2 scales by {1, 1/16} and adds {-1032, -72}: exact, 3 instructions a pair.
int4x8_to_f16x2x4 = ptx_instruction(
    "int4x8_to_f16x2x4",
    "{ .reg .b32 u, t, scale, offset;\n"
    " mov.b32 scale, 0x2c003c00; mov.b32 offset, 0xd480e408;\n"
    " xor.b32 u, $4, 0x88888888;\n"
    " prmt.b32 t, u, 0, 0x4040; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $0, t, scale, offset;\n"
    " prmt.b32 t, u, 0, 0x4141; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $1, t, scale, offset;\n"
    " prmt.b32 t, u, 0, 0x4242; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $2, t, scale, offset;\n"
    " prmt.b32 t, u, 0, 0x4343; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $3, t, scale, offset; }",
    outputs=_U32x4,
    inputs=(types.uint32,),
    instruction="prmt/lop3/fma.rn.f16x2 INT4 dequant",
    doc="Eight signed 4-bit weights (weight k in bits 4k..4k+3, GPTQ order) -> four "
    "f16x2 (weights 2j, 2j+1 in output j, low half first), exact. Emits ``xor.b32``, "
    "then per pair ``prmt.b32`` + ``lop3.b32`` + ``fma.rn.f16x2``.",
)


# With a zero point: the same conversion with the fma's addend in registers, one per
# column. A word of the W4A16 fragment layout (kernels.helpers.int4) holds four weights of
# column a (outputs 0, 1) and four of column b (outputs 2, 3); ``off_a`` / ``off_b`` are
# the f16x2 {-(1032 + z), -(72 + z)} of each column's zero z (-8..7), so the result is
# n - z, exact (|n - z| <= 15).
int4x8_to_f16x2x4_offset = ptx_instruction(
    "int4x8_to_f16x2x4_offset",
    "{ .reg .b32 u, t, scale;\n"
    " mov.b32 scale, 0x2c003c00;\n"
    " xor.b32 u, $4, 0x88888888;\n"
    " prmt.b32 t, u, 0, 0x4040; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $0, t, scale, $5;\n"
    " prmt.b32 t, u, 0, 0x4141; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $1, t, scale, $5;\n"
    " prmt.b32 t, u, 0, 0x4242; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $2, t, scale, $6;\n"
    " prmt.b32 t, u, 0, 0x4343; lop3.b32 t, t, 0x00f0000f, 0x64006400, 0xea;\n"
    " fma.rn.f16x2 $3, t, scale, $6; }",
    outputs=_U32x4,
    inputs=(types.uint32, types.uint32, types.uint32),
    instruction="prmt/lop3/fma.rn.f16x2 INT4 dequant, zero in the addend",
    doc="(word, off_a, off_b) -> four f16x2: as :data:`int4x8_to_f16x2x4` but output j "
    "is ``fma(t, {1, 1/16}, off)`` with ``off_a`` for j = 0, 1 and ``off_b`` for j = 2, 3 "
    "(f16x2 {-(1032 + z), -(72 + z)} subtracts a zero point z as well).",
)

# bf16 has 7 mantissa bits: 0x4300 (128.0) | n reads as 128 + n for a nibble in the low 4
# bits, but a nibble in bits 4-7 would reach the exponent. So the high nibble of each byte
# is shifted down first (v = u >> 4) and prmt takes byte j of u into byte 0 and byte j of v
# into byte 2; lop3 keeps their low nibbles, ORs in 0x4300, and fma.rn.bf16x2 by 1 adds
# -(136 + z): exact.
int4x8_to_bf16x2x4_offset = ptx_instruction(
    "int4x8_to_bf16x2x4_offset",
    "{ .reg .b32 u, v, t, one;\n"
    " mov.b32 one, 0x3f803f80;\n"
    " xor.b32 u, $4, 0x88888888; shr.b32 v, u, 4;\n"
    " prmt.b32 t, u, v, 0x0400; lop3.b32 t, t, 0x000f000f, 0x43004300, 0xea;\n"
    " fma.rn.bf16x2 $0, t, one, $5;\n"
    " prmt.b32 t, u, v, 0x0501; lop3.b32 t, t, 0x000f000f, 0x43004300, 0xea;\n"
    " fma.rn.bf16x2 $1, t, one, $5;\n"
    " prmt.b32 t, u, v, 0x0602; lop3.b32 t, t, 0x000f000f, 0x43004300, 0xea;\n"
    " fma.rn.bf16x2 $2, t, one, $6;\n"
    " prmt.b32 t, u, v, 0x0703; lop3.b32 t, t, 0x000f000f, 0x43004300, 0xea;\n"
    " fma.rn.bf16x2 $3, t, one, $6; }",
    outputs=_U32x4,
    inputs=(types.uint32, types.uint32, types.uint32),
    instruction="shr/prmt/lop3/fma.rn.bf16x2 INT4 dequant, zero in the addend",
    doc="(word, off_a, off_b) -> four bf16x2 (weights 2j, 2j+1 of the eight signed "
    "nibbles in output j, low half first), each ``n - z``: ``off_a`` (j = 0, 1) and "
    "``off_b`` (j = 2, 3) are the bf16x2 {-(136 + z), -(136 + z)} of a zero point z. "
    "Emits ``xor.b32``, ``shr.b32``, then per pair ``prmt.b32`` + ``lop3.b32`` + "
    "``fma.rn.bf16x2``.",
)
