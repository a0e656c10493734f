"""Device helpers every kaionb kernel is written against (see docs/writing-kernels.md).

- :mod:`.reduce`     warp_sum, warp_max, block_sum, block_max, block_sums;
                     cluster_reducers and cluster_sums (sm_90)
- :mod:`.fragments`  mma.sync fragment maps and ldmatrix lane addressing
- :mod:`.tiles`      swizzled shared tiles and the cp.async tile loader
- :mod:`.epilogue`   f32 accumulators (fragments or a staged shared tile) -> f16 / bf16 /
                     f32 stores
- :mod:`.attention`  one block's FlashAttention forward (mma.sync): online softmax over
                     K/V tiles streamed by cp.async, P reused from registers; the tiles,
                     loaders and staged store every attention block shares
- :mod:`.attention_wgmma`  the same block on Hopper's wgmma (sm_90a), P as the register
                     operand of P·V, softmax overlapped with P·V
- :mod:`.attention_bwd`  FlashAttention backward blocks (mma.sync): dK/dV per key tile,
                     dQ per query tile, from the forward's lse, deterministic
- :mod:`.warp_mma`   a warp's strip GEMMs (16 rows) on the swizzled panel tiles: A·Bᵀ and
                     P·B with P from registers
- :mod:`.gemm_block` one block's mma.sync GEMM tile: mainloop, split-K fold, stores
- :mod:`.weight_stream` one block's decode GEMM (M ≤ 16): K-major weights loaded straight
                     into mma fragments, warps splitting K (int8 W8A8 and f16 / bf16)
- :mod:`.int8`       symmetric INT8 quantization arithmetic, per-row quantization by a block
- :mod:`.int4`       the packed INT4 (GPTQ) weight layout, its conversion into mma fragments,
                     one block's weight-streaming W4A16 GEMM
- :mod:`.vector`     128-bit vector loads and stores
- :mod:`.rowwise`    row kernels' building blocks: per-dtype 16-byte codecs (load, store,
                     unpack to / pack from f32), [rows, n] views and launch plans

All are ``@device_function`` (``cuda.jit(device=True, forceinline=True)``) functions. fragments, the swizzle
math and ``make_smem_desc`` run under the CUDA simulator; reduce needs warp shuffles
and the rest inline PTX, which the simulator does not have.
"""

from .epilogue import (
    OUT_BF16,
    OUT_F16,
    OUT_F32,
    pack_pair,
    store_c_frag_bf16,
    store_c_frag_f16,
    store_c_frag_f32,
    store_row_chunk8,
)
from .fragments import (
    frag_a_m16n8k8_tf32,
    frag_a_m16n8k16,
    frag_a_m16n8k32_s8,
    frag_b_m16n8k8_tf32,
    frag_b_m16n8k16,
    frag_b_m16n8k32_s8,
    frag_c_m16n8,
    ldmatrix_x4_b_row_col,
    ldmatrix_x4_row_col,
)
from .reduce import block_max, block_sum, cluster_reducers, warp_max, warp_sum
from .tiles import chunk_coords, cp_async_tile_16b, swizzle_128b, swizzled_index
from .vector import (
    load_f32x4,
    load_f32x4_masked,
    load_f32x4_readonly,
    load_u32x4,
    load_u32x4_readonly,
    store_f32x4,
    store_f32x4_masked,
    store_u32x4,
)

__all__ = [name for name in dir() if not name.startswith("_")]
