"""Epilogues: write an m16n8 f32 accumulator fragment to a 2-D output.

The C fragment (see :mod:`.fragments`) gives each lane two adjacent columns in two rows,
so a lane stores one packed pair per row: two halves in one 32-bit ``st.global.b32``
when both columns exist and the pair is 4-byte aligned (N even), otherwise element by
element. Rows and columns past (M, N) are skipped, so edge tiles need no other path.
f16/bf16 outputs are uint16 arrays holding the bit patterns (round to nearest even).
"""


from kaionb.ptx_patches import (
    cvt_rn_bf16x2_f32,
    cvt_rn_f16x2_f32,
    device_function,
    global_addr,
    st_global_b32,
)


@device_function
def _store_pair_u16(out, row, col, packed):
    m, n = out.shape
    if row >= m or col >= n:
        return
    if col + 1 < n and n % 2 == 0:
        st_global_b32(global_addr(out, (row, col)), packed)
    else:
        out[row, col] = packed & 0xFFFF
        if col + 1 < n:
            out[row, col + 1] = packed >> 16


@device_function
def store_c_frag_f16(out, row0, col0, lane, d):
    """Store fragment ``d`` (4×f32, m16n8 C layout) of the 16×8 block at (row0, col0)
    into the uint16 (f16 bits) array ``out``, bounds-checked."""
    g, t = lane // 4, lane % 4
    _store_pair_u16(out, row0 + g, col0 + 2 * t, cvt_rn_f16x2_f32(d[0], d[1]))
    _store_pair_u16(out, row0 + g + 8, col0 + 2 * t, cvt_rn_f16x2_f32(d[2], d[3]))


@device_function
def store_c_frag_bf16(out, row0, col0, lane, d):
    """As :func:`store_c_frag_f16` with bf16 output."""
    g, t = lane // 4, lane % 4
    _store_pair_u16(out, row0 + g, col0 + 2 * t, cvt_rn_bf16x2_f32(d[0], d[1]))
    _store_pair_u16(out, row0 + g + 8, col0 + 2 * t, cvt_rn_bf16x2_f32(d[2], d[3]))


@device_function
def store_c_frag_f32(out, row0, col0, lane, d):
    """Store fragment ``d`` into the float32 array ``out``, bounds-checked."""
    g, t = lane // 4, lane % 4
    m, n = out.shape
    for i in range(4):
        r = row0 + g + 8 * (i // 2)
        c = col0 + 2 * t + i % 2
        if r < m and c < n:
            out[r, c] = d[i]
