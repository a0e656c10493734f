"""Bulk asynchronous copies (TMA, sm_90): ``cp.async.bulk``, ``cp.async.bulk.tensor``,
their completion groups, tensor-map prefetch and the async-proxy fence.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk
(and ``cp.async.bulk.tensor``:
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk-tensor;
``prefetch.tensormap``: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-prefetch-prefetchu;
``fence.proxy.async``: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar).

Loads (global → shared) complete their bytes on an mbarrier (:mod:`.mbarrier`); stores
(shared → global) are tracked per thread by bulk async-groups (``commit_group``,
``wait_group``). Bulk copies and wgmma access shared memory through the *async proxy*:
shared-memory writes by ordinary instructions (``st.shared``, ``cp.async``) must be made
visible to it with :data:`fence_proxy_async_shared` before a bulk store or a wgmma reads
them.

TMA (``cp.async.bulk.tensor``): the CUDA idiom passes the 128-byte CUtensorMap as a
``const __grid_constant__`` kernel parameter; numba has no way to declare one (kernel
arguments are numba types, and there is no 128-byte opaque by-value parameter nor the
``.param`` address it would need). kaionb encodes the map on the host
(``cuTensorMapEncodeTiled``, :mod:`kaionb._tensor_map`), copies it into global memory and
passes its generic address as a uint64 (the ISA accepts a tensor map in the global state
space; prefetch it with ``prefetch.tensormap``): the loads and stores of
:mod:`kaionb.kernels.matmul_hopper` run this way on the H100. The 1-D bulk copy
``cp.async.bulk`` needs no map. The multicast load of a cluster is in :mod:`.cluster`.
"""

from numba import types

from ._factory import IMM, SM90, ptx_instruction

fence_proxy_async_shared = ptx_instruction(
    "fence_proxy_async_shared",
    "fence.proxy.async.shared::cta;",
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``fence.proxy.async.shared::cta;``: make generic-proxy shared-memory writes "
    "(st.shared, cp.async) visible to the async proxy (wgmma, bulk copies).",
)

cp_async_bulk_global_to_shared = ptx_instruction(
    "cp_async_bulk_global_to_shared",
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
    inputs=(types.uint32, types.uint64, types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], "
    "[src], size, [bar];``: TMA 1-D copy (size and addresses multiples of 16 bytes); "
    "completes ``size`` transaction bytes on the mbarrier.",
)

cp_async_bulk_tensor_2d_global_to_shared = ptx_instruction(
    "cp_async_bulk_tensor_2d_global_to_shared",
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
    "[$0], [$1, {$2, $3}], [$4];",
    inputs=(types.uint32, types.uint64, types.int32, types.int32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
    instruction="cp.async.bulk.tensor.2d",
    doc="``cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::"
    "bytes [dst], [tensor_map, {x, y}], [bar];`` with the tensor map in global memory "
    "(generic address as u64); (x, y) = (column, row) of the box's first element.",
)

cp_async_bulk_tensor_2d_shared_to_global = ptx_instruction(
    "cp_async_bulk_tensor_2d_shared_to_global",
    "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [$0, {$1, $2}], [$3];",
    inputs=(types.uint64, types.int32, types.int32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
    instruction="cp.async.bulk.tensor.2d.global.shared::cta",
    doc="``cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [tensor_map, {x, y}], "
    "[src];``: TMA store of one box from shared memory (laid out as the map's swizzle "
    "says); elements past the tensor are not written. Completion: bulk async-groups.",
)

cp_async_bulk_commit_group = ptx_instruction(
    "cp_async_bulk_commit_group",
    "cp.async.bulk.commit_group;",
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``cp.async.bulk.commit_group;``: close this thread's group of bulk stores.",
)

cp_async_bulk_wait_group_read = ptx_instruction(
    "cp_async_bulk_wait_group_read",
    "cp.async.bulk.wait_group.read $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``cp.async.bulk.wait_group.read N;``: wait until at most N of this thread's bulk "
    "groups still read their shared-memory source (the buffer may then be rewritten).",
)

cp_async_bulk_wait_group = ptx_instruction(
    "cp_async_bulk_wait_group",
    "cp.async.bulk.wait_group $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``cp.async.bulk.wait_group N;``: wait until at most N of this thread's bulk "
    "groups are pending (their writes done).",
)

prefetch_tensormap = ptx_instruction(
    "prefetch_tensormap",
    "prefetch.tensormap [$0];",
    inputs=(types.uint64,),
    side_effect=True,
    arch=SM90,
    doc="``prefetch.tensormap [addr];``: bring a tensor map in global memory into cache.",
)
