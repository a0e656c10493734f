"""The inline-PTX instruction layer: numba intrinsics for what numba.cuda lacks.

Each module is one instruction family; every instruction is declared through the one
factory in :mod:`._factory` and its docstring names the PTX it emits. Nothing else in
kaionb writes PTX text. See docs/writing-kernels.md.

- :mod:`._factory`    ``ptx_instruction``, ``IMM``, ``device_function``, the arch gate
- :mod:`.mma`         ``mma.sync`` (f16, bf16, tf32, s8)
- :mod:`.ldmatrix`    ``ldmatrix`` x1/x2/x4, plain and transposed
- :mod:`.cp_async`    ``cp.async`` global → shared copies and their groups (sm_80)
- :mod:`.memory`      addresses, 128-bit vector loads/stores, ``st.global.b32``
- :mod:`.convert`     f16/bf16 packing, int8/int4 dequantization, ``prmt``, ``lop3``
- :mod:`.fast_math`   ``ex2``/``tanh``/``rcp``/``rsqrt`` approximations, half2 ``fma``
- :mod:`.wgmma`       Hopper warpgroup MMA, its fence/commit/wait, smem descriptors
- :mod:`.accumulator_store`  store sequences for wgmma accumulators (epilogues)
- :mod:`.accumulator_softmax`  the online softmax on a wgmma accumulator (attention)
- :mod:`.mbarrier`    shared-memory barriers with transaction counts (sm_90)
- :mod:`.bulk_copy`   TMA: ``cp.async.bulk`` 1-D and tensor copies, their groups,
                      ``prefetch.tensormap``, the async-proxy fence (sm_90)
- :mod:`.sync`        named barriers (``bar.sync``) and ``setmaxnreg`` (sm_90a)
- :mod:`.cluster`     thread-block clusters: rank, index, barrier, remote arrive, loads,
                      asynchronous remote stores, multicast
"""

from types import ModuleType as _ModuleType

from ._factory import (
    IMM,
    ArchitectureError,
    device_function,
    ptx_instruction,
    target_cc,
)
from .accumulator_softmax import (
    accumulator_exp2,
    accumulator_mask_columns,
    accumulator_pack,
    accumulator_row_max,
    accumulator_scale_rows,
    st_shared_accumulator_f32,
)
from .accumulator_store import (
    st_global_accumulator,
    st_global_accumulator_s32_scaled,
    st_shared_accumulator_swizzled,
)
from .bulk_copy import (
    cp_async_bulk_commit_group,
    cp_async_bulk_global_to_shared,
    cp_async_bulk_tensor_2d_global_to_shared,
    cp_async_bulk_tensor_2d_shared_to_global,
    cp_async_bulk_wait_group,
    cp_async_bulk_wait_group_read,
    fence_proxy_async_shared,
    prefetch_tensormap,
)
from .cluster import (
    add_shared_f32,
    cluster_arrive,
    cluster_arrive_relaxed,
    cluster_ctarank,
    cluster_id_x,
    cluster_wait,
    cp_async_bulk_tensor_2d_multicast,
    fence_mbarrier_init_cluster,
    ld_shared_cluster_f32,
    ld_shared_cluster_v4_f32,
    mbarrier_arrive_remote,
    st_async_cluster_f32,
)
from .convert import (
    bf16x2_to_f32x2,
    cvt_rn_bf16x2_f32,
    cvt_rn_f16_s8,
    cvt_rn_f16x2_f32,
    f16x2_to_f32x2,
    int4x8_to_bf16x2x4_offset,
    int4x8_to_f16x2x4,
    int4x8_to_f16x2x4_offset,
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
    ld_global_nc_f32,
    ld_global_nc_stream_v4_u32,
    ld_global_nc_u32,
    ld_global_nc_v2_u32,
    ld_global_nc_v4_f32,
    ld_global_nc_v4_u32,
    ld_global_v4_f32,
    ld_global_v4_u32,
    ld_shared_v2_u32,
    ld_shared_v4_u32,
    shared_addr,
    st_global_b32,
    st_global_v2_u32,
    st_global_v4_f32,
    st_global_v4_u32,
    st_shared_v2_u32,
    st_shared_v4_u32,
)
from .mbarrier import (
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait_parity,
    mbarrier_wait,
    mbarrier_wait_cluster,
)
from .mma import (
    mma_m16n8k8_f32_tf32,
    mma_m16n8k16_f16_f16,
    mma_m16n8k16_f32_bf16,
    mma_m16n8k16_f32_f16,
    mma_m16n8k32_s32_s8,
)
from .sync import bar_sync_threads, setmaxnreg_dec, setmaxnreg_inc
from .wgmma import (
    accumulator_zeros,
    accumulator_zeros_s32,
    make_smem_desc,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_m64n64k16_f32_bf16,
    wgmma_m64n64k16_f32_bf16_rs,
    wgmma_m64n64k16_f32_f16,
    wgmma_m64n64k16_f32_f16_rs,
    wgmma_m64n128k16_f32_bf16,
    wgmma_m64n128k16_f32_bf16_rs,
    wgmma_m64n128k16_f32_f16,
    wgmma_m64n128k16_f32_f16_rs,
    wgmma_m64n256k16_f32_bf16,
    wgmma_m64n256k16_f32_bf16_rs,
    wgmma_m64n256k16_f32_f16,
    wgmma_m64n256k16_f32_f16_rs,
    wgmma_m64n128k32_s32_s8,
    wgmma_m64n256k32_s32_s8,
    wgmma_wait_group,
    wgmma_wait_group_holding,
)

# The instructions and factory names; the submodules (bound here by the imports above)
# are not part of the API.
__all__ = sorted(
    name for name, value in globals().items()
    if not name.startswith("_") and not isinstance(value, _ModuleType)
)
