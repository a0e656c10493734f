"""The inline-PTX instruction layer: numba intrinsics for what numba.cuda lacks.

Each module is one instruction family; every instruction is declared through the one
factory in :mod:`._factory` and its docstring names the PTX it emits. Nothing else in
kaionb writes PTX text. See docs/writing-kernels.md.
"""

from ._factory import (
    IMM,
    ArchitectureError,
    device_function,
    ptx_instruction,
    target_cc,
)
from .cluster import (
    cluster_arrive,
    cluster_ctarank,
    cluster_wait,
    cp_async_bulk_tensor_2d_multicast,
    fence_mbarrier_init_cluster,
    mbarrier_arrive_remote,
)
from .convert import (
    bf16x2_to_f32x2,
    cvt_rn_bf16x2_f32,
    cvt_rn_f16_s8,
    cvt_rn_f16x2_f32,
    f16x2_to_f32x2,
    int4x8_to_f16x2x4,
    lop3_b32,
    prmt_b32,
)
from .cp_async import (
    cp_async_ca_4,
    cp_async_ca_8,
    cp_async_ca_16,
    cp_async_cg_16,
    cp_async_commit_group,
    cp_async_wait_all,
    cp_async_wait_group,
)
from .fast_math import (
    ex2_approx_f32,
    fma_rn_bf16x2,
    fma_rn_f16x2,
    rcp_approx_f32,
    rsqrt_approx_f32,
    tanh_approx_f32,
)
from .ldmatrix import (
    ldmatrix_x1,
    ldmatrix_x1_trans,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
)
from .memory import (
    global_addr,
    ld_global_nc_v4_f32,
    ld_global_nc_v4_u32,
    ld_global_v4_f32,
    ld_global_v4_u32,
    ld_shared_v2_u32,
    ld_shared_v4_u32,
    shared_addr,
    st_global_b32,
    st_global_v4_f32,
    st_global_v4_u32,
    st_shared_v2_u32,
    st_shared_v4_u32,
)
from .mma import (
    mma_m16n8k8_f32_tf32,
    mma_m16n8k16_f16_f16,
    mma_m16n8k16_f32_bf16,
    mma_m16n8k16_f32_f16,
    mma_m16n8k32_s32_s8,
)
from .wgmma import (
    accumulator_zeros,
    bar_sync_threads,
    cp_async_bulk_commit_group,
    cp_async_bulk_global_to_shared,
    cp_async_bulk_tensor_2d_global_to_shared,
    cp_async_bulk_tensor_2d_shared_to_global,
    cp_async_bulk_wait_group,
    cp_async_bulk_wait_group_read,
    fence_proxy_async_shared,
    make_smem_desc,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait_parity,
    mbarrier_wait,
    prefetch_tensormap,
    setmaxnreg_dec,
    setmaxnreg_inc,
    st_global_accumulator,
    st_shared_accumulator_swizzled,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_m64n64k16_f32_bf16,
    wgmma_m64n64k16_f32_f16,
    wgmma_m64n128k16_f32_bf16,
    wgmma_m64n128k16_f32_f16,
    wgmma_m64n256k16_f32_bf16,
    wgmma_m64n256k16_f32_f16,
    wgmma_wait_group,
)

__all__ = [name for name in dir() if not name.startswith("_")]
