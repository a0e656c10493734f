"""The online softmax on a wgmma accumulator in registers (FlashAttention's S = Q·Kᵀ).

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#floating-point-instructions
(``max``, ``fma``, ``mul``, ``ex2.approx``, ``selp``) and ``cvt.rn.{f16,bf16}x2.f32``.

Procedures, as in :mod:`.accumulator_store`: each factory call returns one intrinsic
whose PTX is a straight-line sequence over the whole m64nN f32 accumulator tuple (N/2
values per thread, the layout :mod:`.wgmma` describes: values 4j, 4j+1 in the thread's
row g = lane/4 at columns 8j + 2·(lane%4) + {0, 1}; 4j+2, 4j+3 in row g + 8), so numba
never indexes the tuple (an indexed tuple lands in local memory). Per row the thread
holds N/4 values; the quad's other three lanes hold the rest of the row (the caller
reduces across them with shuffles). Plain sm_80+ PTX, no arch gate: the callers are
sm_90a kernels.
"""

from numba import types

from ._factory import ptx_instruction


def _acc(n: int):
    return types.UniTuple(types.float32, n // 2)


def accumulator_row_max(n: int):
    """``(acc, m_lo, m_hi) -> (max_lo, max_hi)``: the running maxima of the thread's two
    rows, m_lo / m_hi folded with the thread's N/4 values of each row."""
    count = n // 2
    lines = ["{"]
    for row, out in ((0, 0), (1, 1)):
        lines.append(f"mov.f32 ${out}, ${2 + count + row};")
        for j in range(n // 8):
            lines.append(f"max.f32 ${out}, ${out}, ${2 + 4 * j + 2 * row};")
            lines.append(f"max.f32 ${out}, ${out}, ${2 + 4 * j + 2 * row + 1};")
    lines.append("}")
    return ptx_instruction(
        f"accumulator_row_max_n{n}",
        "\n".join(lines),
        outputs=types.UniTuple(types.float32, 2),
        inputs=(_acc(n), types.float32, types.float32),
        instruction="max.f32",
        doc=f"Row maxima of an m64n{n} f32 accumulator's two rows of this thread, folded "
        "with the running maxima given.",
    )


def accumulator_mask_columns(n: int):
    """``(keys_lo, keys_hi, acc) -> acc``: values whose column (8j + e of the thread, e =
    0, 1; the caller folds the tile's first column and 2·(lane%4) into ``keys``) is at or
    past ``keys_lo`` (row g) or ``keys_hi`` (row g + 8) become −inf."""
    count = n // 2
    lines = ["{ .reg .pred p;"]
    for j in range(n // 8):
        for e in range(4):
            keys = count + (e // 2)
            col = 8 * j + e % 2
            lines.append(f"setp.le.s32 p, ${keys}, {col};")
            lines.append(f"selp.f32 ${4 * j + e}, 0fFF800000, ${4 * j + e}, p;")
    lines.append("}")
    return ptx_instruction(
        f"accumulator_mask_columns_n{n}",
        "\n".join(lines),
        outputs=_acc(n),
        inputs=(types.int32, types.int32, _acc(n)),
        tied=2,
        instruction="selp.f32",
        doc=f"Mask an m64n{n} f32 accumulator's columns at or past a per-row limit to −inf.",
    )


def accumulator_exp2(n: int):
    """``(scale, neg_lo, neg_hi, acc) -> (p..., sum_lo, sum_hi)``: p = 2^(s·scale + neg)
    for every value (neg = −max·scale of its row) in place, and the thread's sums of each
    row's p."""
    count = n // 2
    lines = ["{"]
    lines.append(f"mov.f32 ${count}, 0f00000000;")
    lines.append(f"mov.f32 ${count + 1}, 0f00000000;")
    for j in range(n // 8):
        for e in range(4):
            v = 4 * j + e
            neg = count + 3 + e // 2
            lines.append(f"fma.rn.f32 ${v}, ${v}, ${count + 2}, ${neg};")
            lines.append(f"ex2.approx.ftz.f32 ${v}, ${v};")
            lines.append(f"add.f32 ${count + e // 2}, ${count + e // 2}, ${v};")
    lines.append("}")
    return ptx_instruction(
        f"accumulator_exp2_n{n}",
        "\n".join(lines),
        outputs=types.UniTuple(types.float32, count + 2),
        inputs=(types.float32, types.float32, types.float32, _acc(n)),
        tied=3,
        instruction="ex2.approx.ftz.f32",
        doc=f"Exponentials of an m64n{n} f32 accumulator (scaled, max subtracted) in "
        "place, with the thread's row sums appended.",
    )


def accumulator_scale_rows(n: int):
    """``(alpha_lo, alpha_hi, acc) -> acc``: row g's values times alpha_lo, row g + 8's
    times alpha_hi (the online softmax's rescale of O, and the final 1/ℓ)."""
    count = n // 2
    lines = [f"mul.f32 ${v}, ${v}, ${count + (v % 4) // 2};" for v in range(count)]
    return ptx_instruction(
        f"accumulator_scale_rows_n{n}",
        "\n".join(lines),
        outputs=_acc(n),
        inputs=(types.float32, types.float32, _acc(n)),
        tied=2,
        instruction="mul.f32",
        doc=f"Scale the two rows of an m64n{n} f32 accumulator held by this thread.",
    )


def accumulator_pack(n: int, kind: str):
    """``acc -> (u32, ...)``: the accumulator as ``kind`` ("f16" / "bf16") pairs, value
    2i in the low half of word i. For an S accumulator, words 4kk … 4kk+3 are exactly the
    m16n8k16 A fragment of k-step kk (columns 16kk … 16kk+15): P for the P·V wgmma."""
    count = n // 2
    lines = [f"cvt.rn.{kind}x2.f32 ${i}, ${count // 2 + 2 * i + 1}, ${count // 2 + 2 * i};"
             for i in range(count // 2)]
    return ptx_instruction(
        f"accumulator_pack_n{n}_{kind}",
        "\n".join(lines),
        outputs=types.UniTuple(types.uint32, count // 2),
        inputs=(_acc(n),),
        instruction=f"cvt.rn.{kind}x2.f32",
        doc=f"An m64n{n} f32 accumulator as packed {kind} pairs.",
    )


def st_shared_accumulator_f32(n: int):
    """``(row_lo, row_hi, acc)``: the thread's values of an m64n{n} f32 accumulator to
    shared memory, row g at byte address ``row_lo`` (the thread's first column, 2·(lane%4)
    floats in) and row g + 8 at ``row_hi``, 8-byte stores 32 bytes apart."""
    lines = []
    for j in range(n // 8):
        lines.append(f"st.shared.v2.f32 [$0+{32 * j}], {{${2 + 4 * j}, ${3 + 4 * j}}};")
        lines.append(f"st.shared.v2.f32 [$1+{32 * j}], {{${4 + 4 * j}, ${5 + 4 * j}}};")
    return ptx_instruction(
        f"st_shared_accumulator_f32_n{n}",
        "\n".join(lines),
        inputs=(types.uint32, types.uint32, _acc(n)),
        side_effect=True,
        memory=True,
        instruction="st.shared.v2.f32",
        doc=f"Store an m64n{n} f32 accumulator's two rows of this thread to shared memory.",
    )
