"""Store sequences for wgmma accumulators, used by the epilogues of the Hopper kernels.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-st
(and ``cvt.rn.f16x2.f32`` / ``cvt.rn.bf16x2.f32``:
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cvt).

These are procedures, not single instructions: each factory call returns one intrinsic
whose PTX is a straight-line sequence of ``cvt`` and ``st`` instructions, generated for
one accumulator width N (and output type), that writes (part of) an m64nN f32 wgmma
accumulator in the register layout :mod:`.wgmma` describes, taking the whole tuple as
its operands; :func:`st_global_accumulator_s32_scaled` stores an s32 (int8)
accumulator scaled into f32. The epilogues of :mod:`kaionb.kernels.matmul_hopper` are
built from them; they live in the instruction layer because nothing outside
``kaionb.ptx_patches`` writes PTX text. Plain ``st``, ``ld`` and
``cvt.rn.{f16,bf16}x2.f32``: no arch gate (sm_80 and newer).
"""

from numba import types

from ._factory import ptx_instruction


def st_shared_accumulator_swizzled(n: int, kind: str, part: int = 0, parts: int = 1):
    """The instruction that stores columns ``[part·n/parts, (part+1)·n/parts)`` of an
    m64nN f32 wgmma accumulator as ``kind`` ("f16" or "bf16") into the shared staging
    layout of a TMA store with the 128-byte swizzle: 64-column boxes of 64 rows (8 KB
    each, one after another from the buffer's start), row r's 16-byte chunk c at
    ``r·128 + ((c ^ r%8)·16)``. ``(row_base: u32, row_xor: u32, acc)``: ``row_base`` =
    the buffer's address + row·128 + 4·(lane%4) for this thread's first row
    (``16·warp + lane/4``), ``row_xor`` = (row % 8)·16. Conflict-free: the 8 rows of a
    warp's store land in 8 different chunks."""
    count = n // 2
    pairs = n // 8 // parts  # column pairs (8 columns apart) per thread in this part
    lines = ["{ .reg .b32 h, a0, a1, a2, a3, a4, a5, a6, a7;"]
    for c in range(8):
        lines.append(f"xor.b32 a{c}, $1, {16 * c};")
        lines.append(f"add.u32 a{c}, a{c}, $0;")
    for i in range(pairs):
        j = part * pairs + i
        box, c = divmod(i, 8)
        for row_off, lo, hi in ((0, 4 * j + 2, 4 * j + 3), (1024, 4 * j + 4, 4 * j + 5)):
            lines.append(f"cvt.rn.{kind}x2.f32 h, ${hi}, ${lo};")
            lines.append(f"st.shared.b32 [a{c}+{box * 8192 + row_off}], h;")
    lines.append("}")
    return ptx_instruction(
        f"st_shared_accumulator_swizzled_n{n}_{kind}_{part}of{parts}",
        "\n".join(lines),
        inputs=(types.uint32, types.uint32, types.UniTuple(types.float32, count)),
        side_effect=True,
        memory=True,
        instruction="st.shared.b32",
        doc=f"Store part {part} of {parts} of an m64n{n} f32 accumulator as {kind} into "
        "128-byte-swizzled 64×64 boxes (see :func:`st_shared_accumulator_swizzled`).",
    )


def _store_pairs(kind: str, j: int, v0: str, v1: str, v2: str, v3: str) -> list:
    """PTX storing pair j of a thread's accumulator — f32 values v0, v1 (row 0) and v2, v3
    (row 8) — at byte ``8·j·width`` past the row addresses $0 / $1, in ``kind``, where
    predicate ``c`` (the column exists) and the row's flag (r0 / r8) hold."""
    width = 4 if kind == "f32" else 2  # bytes per element
    off = 8 * width * j
    lines = []
    for base, pred, lo, hi in (("$0", "r0", v0, v1), ("$1", "r8", v2, v3)):
        lines.append(f"and.pred p, c, {pred};")
        if kind == "f32":
            lines.append(f"@p st.global.v2.f32 [{base}+{off}], {{{lo}, {hi}}};")
        else:
            lines.append(f"cvt.rn.{kind}x2.f32 h, {hi}, {lo};")
            lines.append(f"@p st.global.b32 [{base}+{off}], h;")
    return lines


def st_global_accumulator(n: int, kind: str):
    """The instruction that stores an m64nN f32 wgmma accumulator straight to a row-major
    global output, in ``kind`` ("f32", "f16" or "bf16", round to nearest even):
    ``(addr0: u64, addr8: u64, row0_ok: u32, row8_ok: u32, cols_left: i32, acc)``.
    ``addr0`` / ``addr8`` address this thread's first pair in rows ``16·warp + lane/4`` and
    8 rows below, column ``2·(lane%4)``; pair j (8j columns further) is stored where
    ``8j < cols_left`` and its row's flag is set — the output's columns must come in
    aligned pairs (even N, 8-byte-aligned f32 / 4-byte-aligned 16-bit rows)."""
    count = n // 2
    lines = ["{ .reg .pred r0, r8, c, p; .reg .b32 h;",
             "setp.ne.b32 r0, $2, 0;", "setp.ne.b32 r8, $3, 0;"]
    for j in range(n // 8):
        lines.append(f"setp.gt.s32 c, $4, {8 * j};")
        lines += _store_pairs(kind, j, *(f"${4 * j + 5 + e}" for e in range(4)))
    lines.append("}")
    return ptx_instruction(
        f"st_global_accumulator_n{n}_{kind}",
        "\n".join(lines),
        inputs=(types.uint64, types.uint64, types.uint32, types.uint32, types.int32,
                types.UniTuple(types.float32, count)),
        side_effect=True,
        memory=True,
        instruction="st.global.v2.f32" if kind == "f32" else "st.global.b32",
        doc=f"Store an m64n{n} f32 accumulator to global memory as {kind}, predicated by "
        "row and column (see :func:`st_global_accumulator`).",
    )



def st_global_accumulator_s32_scaled(n: int, kind: str):
    """As :func:`st_global_accumulator` for an m64nN **s32** accumulator (int8 wgmma),
    scaled into f32 on the way: ``f32(acc) · row_scale · col_scale + bias`` (the W8A8
    epilogue: per-token and per-channel scales), then stored in ``kind``. Fused so the
    f32 values never exist as a second accumulator (128 more registers). ``(addr0, addr8,
    row0_ok, row8_ok, cols_left, acc: s32 tuple, row_scale0: f32, row_scale8: f32,
    col_scale: u64, col_step: u64, has_col_scale: u32, bias: u64, has_bias: u32)``: the
    first five as for :func:`st_global_accumulator`; ``row_scale0`` / ``row_scale8``
    scale this thread's two rows; ``col_scale`` addresses the f32 scale of its first
    column (``2·(lane%4)``), the next columns ``col_step`` bytes on (4: one per column, 0:
    one for all; 1.0 where ``has_col_scale`` is 0); ``bias`` addresses that column's f32
    bias (0 where ``has_bias`` is 0). Columns at or past ``cols_left`` load nothing."""
    count = n // 2
    sa0, sa8, cs, step, has_cs, bias, has_bias = (f"${5 + count + i}" for i in range(7))
    lines = ["{ .reg .pred r0, r8, c, c1, hs, hb, p; .reg .b32 h;",
             ".reg .f32 s0, s1, b0, b1, v0, v1, v2, v3; .reg .b64 a;",
             "setp.ne.b32 r0, $2, 0;", "setp.ne.b32 r8, $3, 0;",
             f"setp.ne.b32 hs, {has_cs}, 0;", f"setp.ne.b32 hb, {has_bias}, 0;"]
    for j in range(n // 8):
        lines += [f"setp.gt.s32 c, $4, {8 * j};",
                  f"setp.gt.s32 c1, $4, {8 * j + 1};",
                  "mov.f32 s0, 0f3F800000;", "mov.f32 s1, 0f3F800000;",
                  "mov.f32 b0, 0f00000000;", "mov.f32 b1, 0f00000000;",
                  f"mad.lo.u64 a, {step}, {8 * j}, {cs};",
                  "and.pred p, c, hs;", "@p ld.global.nc.f32 s0, [a];",
                  f"add.u64 a, a, {step};",
                  "and.pred p, c1, hs;", "@p ld.global.nc.f32 s1, [a];",
                  "and.pred p, c, hb;", f"@p ld.global.nc.f32 b0, [{bias}+{32 * j}];",
                  "and.pred p, c1, hb;", f"@p ld.global.nc.f32 b1, [{bias}+{32 * j + 4}];"]
        # Elements 4j, 4j+1: row 0, columns 8j + 2t and + 1; 4j+2, 4j+3: row 8.
        for e, row_scale, col_scale, b in ((0, sa0, "s0", "b0"), (1, sa0, "s1", "b1"),
                                           (2, sa8, "s0", "b0"), (3, sa8, "s1", "b1")):
            lines += [f"cvt.rn.f32.s32 v{e}, ${5 + 4 * j + e};",
                      f"mul.f32 v{e}, v{e}, {row_scale};",
                      f"fma.rn.f32 v{e}, v{e}, {col_scale}, {b};"]
        lines += _store_pairs(kind, j, "v0", "v1", "v2", "v3")
    lines.append("}")
    return ptx_instruction(
        f"st_global_accumulator_s32_scaled_n{n}_{kind}",
        "\n".join(lines),
        inputs=(types.uint64, types.uint64, types.uint32, types.uint32, types.int32,
                types.UniTuple(types.int32, count), types.float32, types.float32,
                types.uint64, types.uint64, types.uint32, types.uint64, types.uint32),
        side_effect=True,
        memory=True,
        instruction="st.global.v2.f32" if kind == "f32" else "st.global.b32",
        doc=f"Scale an m64n{n} s32 accumulator per row and column, add a bias, and store "
        f"it as {kind} (see :func:`st_global_accumulator_s32_scaled`).",
    )
