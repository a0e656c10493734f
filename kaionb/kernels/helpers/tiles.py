"""Shared-memory tiles of 16-bit elements: swizzled addressing and cp.async loaders.

Layout: a tile of ``ROWS × COLS`` 16-bit elements (f16/bf16 bit patterns as uint16) is a
1-D ``cuda.shared.array`` stored row-major with the 128-byte swizzle applied to byte
offsets: bits 4-6 (the 16-byte chunk within a 128-byte line) are XORed with bits 7-9
(the line within a 1024-byte atom). Eight consecutive rows of a 64-element tile then land
their chunk 0 in eight different bank groups, so ldmatrix (8 rows × 16 bytes) and the
16-byte cp.async stores are conflict-free; and it is exactly the layout wgmma reads with
the 128-byte-swizzle descriptor when the tile starts 1024-byte aligned and COLS = 64.
The swizzle is a bijection on any tile, so correctness does not depend on COLS; only the
conflict-freedom does (COLS a multiple of 64 is best).

Loaders copy 16-byte chunks (8 elements) with ``cp.async.cg``: a chunk whose rows or
columns fall outside the source matrix is zero-filled (``src_size`` 0 or the bytes that
exist), so edge tiles need no separate path. Global rows must be 16-byte aligned: the
matrix's column count a multiple of 8 (the host entry validates it).
"""


from kaionb.ptx_patches import (
    cp_async_cg_16,
    device_function,
    global_addr,
    shared_addr,
)


@device_function
def swizzle_128b(byte_offset):
    """The 128-byte-swizzled position of a byte offset (bits 4-6 ^= bits 7-9)."""
    return byte_offset ^ ((byte_offset >> 3) & 0x70)


@device_function
def swizzled_index(row, col, COLS):
    """Element index of (row, col) in a swizzled row-major tile of 16-bit elements."""
    return swizzle_128b((row * COLS + col) * 2) >> 1


@device_function
def chunk_coords(q, COLS):
    """(row, col) of chunk ``q`` of a row-major tile of COLS columns cut into chunks of 8
    consecutive elements (16 bytes of a 16-bit tile, 32 of an f32 one)."""
    return q // (COLS // 8), (q % (COLS // 8)) * 8


@device_function
def cp_async_tile_16b(tile, src, row0, col0, ROWS, COLS, tid, nthreads):
    """Start copying ``src[row0:row0+ROWS, col0:col0+COLS]`` into the swizzled ``tile``.

    ``src``: 2-D uint16 global array (M × K, K % 8 == 0); ``tile``: 1-D shared uint16
    array of ROWS·COLS (COLS % 8 == 0). Threads ``tid`` of ``nthreads`` share the chunks.
    Out-of-range chunks are zero-filled. Issues cp.async only: the caller commits the
    group, waits and synchronises.
    """
    m, k = src.shape
    chunks_per_row = COLS // 8
    for chunk in range(tid, ROWS * chunks_per_row, nthreads):
        r = chunk // chunks_per_row
        c = (chunk % chunks_per_row) * 8
        gr, gc = row0 + r, col0 + c
        nbytes = 0
        if gr < m and gc < k:
            nbytes = min(8, k - gc) * 2
        # A zero-size copy still needs a valid address: use the matrix's first element.
        src_addr = global_addr(src, (gr, gc)) if nbytes > 0 else global_addr(src, (0, 0))
        dst = shared_addr(tile, swizzled_index(r, c, COLS))
        cp_async_cg_16(dst, src_addr, nbytes)
