"""Fragment maps of the warp-level mma.sync shapes: which lane holds which element.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-fragment-mma-16816-float

With ``g = lane // 4`` (the "group") and ``t = lane % 4`` (thread in group), for
m16n8k16 (f16/bf16; element i of a fragment is half ``i % 2`` of register ``i // 2``):

    A (16×16, row-major)  i = 0..7   row g + 8·((i // 2) % 2)   col 2t + i % 2 + 8·(i // 4)
    B (16×8,  K×N)        i = 0..3   row (k) 2t + i % 2 + 8·(i // 2)   col (n) g
    C/D (16×8, f32)       i = 0..3   row g + 8·(i // 2)          col 2t + i % 2

(an f16 accumulator packs C elements 2r, 2r+1 in register r). m16n8k32 s8 has four s8
per register: A element i = 0..15 at row g + 8·((i // 4) % 2), col 4t + i % 4 + 16·(i // 8);
B element i = 0..7 at k = 4t + i % 4 + 16·(i // 4), n = g. m16n8k8 tf32, one value per
register: A i = 0..3 at row g + 8·(i % 2), col t + 4·(i // 2); B i = 0..1 at k = t + 4·i,
n = g. C/D is the same for all shapes.

ldmatrix addressing: to load a 16×16 A block of a row-major [m][k] tile with
``ldmatrix_x4``, lane l passes the address of row ``l % 16``, column ``8·(l // 16)``
(:func:`ldmatrix_x4_row_col`); the four registers come back as a0..a3. The same address
on a row-major [k][n] tile with ``ldmatrix_x4_trans`` gives the B fragments of two
adjacent n-blocks: (r0, r1) for columns n..n+7 and (r2, r3) for n+8..n+15. On an [n][k]
tile (B stored N-major) use :func:`ldmatrix_x4_b_row_col` without ``.trans``.

Each function returns ``(row, col)`` and is plain numba (runs under the simulator; the
Python originals, ``fn.py_func``, serve as NumPy models in the tests).
"""

from kaionb.ptx_patches import device_function


@device_function
def frag_a_m16n8k16(lane, i):
    """(row, col) of element ``i`` (0..7) of lane's A fragment, m16n8k16 f16/bf16."""
    g, t = lane // 4, lane % 4
    return g + 8 * ((i // 2) % 2), 2 * t + i % 2 + 8 * (i // 4)


@device_function
def frag_b_m16n8k16(lane, i):
    """(k, n) of element ``i`` (0..3) of lane's B fragment, m16n8k16 f16/bf16."""
    g, t = lane // 4, lane % 4
    return 2 * t + i % 2 + 8 * (i // 2), g


@device_function
def frag_c_m16n8(lane, i):
    """(row, col) of element ``i`` (0..3) of lane's C/D fragment, every m16n8 shape."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


@device_function
def frag_a_m16n8k32_s8(lane, i):
    """(row, col) of element ``i`` (0..15; byte i % 4 of register i // 4) of A, s8 k32."""
    g, t = lane // 4, lane % 4
    return g + 8 * ((i // 4) % 2), 4 * t + i % 4 + 16 * (i // 8)


@device_function
def frag_b_m16n8k32_s8(lane, i):
    """(k, n) of element ``i`` (0..7; byte i % 4 of register i // 4) of B, s8 k32."""
    g, t = lane // 4, lane % 4
    return 4 * t + i % 4 + 16 * (i // 4), g


@device_function
def frag_a_m16n8k8_tf32(lane, i):
    """(row, col) of register ``i`` (0..3) of lane's A fragment, m16n8k8 tf32."""
    g, t = lane // 4, lane % 4
    return g + 8 * (i % 2), t + 4 * (i // 2)


@device_function
def frag_b_m16n8k8_tf32(lane, i):
    """(k, n) of register ``i`` (0..1) of lane's B fragment, m16n8k8 tf32."""
    g, t = lane // 4, lane % 4
    return t + 4 * i, g


@device_function
def ldmatrix_x4_row_col(lane):
    """(row, col) whose address lane passes to ldmatrix_x4 for a 16×16 block.

    [m][k] tile, no .trans -> A fragment; [k][n] tile with .trans -> B of two n-blocks.
    """
    return lane % 16, 8 * (lane // 16)


@device_function
def ldmatrix_x4_b_row_col(lane):
    """(n, k) whose address lane passes to ldmatrix_x4 (no .trans) on an [n][k] tile:
    registers (r0, r1) are B for n-block 0 and (r2, r3) for n-block 1 (16 k each)."""
    return 8 * (lane // 16) + lane % 8, 8 * ((lane // 8) % 2)
