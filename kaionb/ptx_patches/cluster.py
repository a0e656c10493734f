"""Hopper (sm_90) thread-block clusters: rank and cluster index, cluster barrier, remote
mbarrier arrive, remote shared-memory loads and asynchronous remote stores, and TMA
multicast.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#cluster-of-cooperative-thread-arrays
(``%cluster_ctarank``, ``barrier.cluster``, ``mapa``, ``mbarrier.arrive`` on a
``shared::cluster`` address, ``st.async``, ``cp.async.bulk.tensor ... .multicast::cluster``).

A cluster is launched with a cluster dimension (``CompiledKernel(..., cluster=(2, 1, 1))``
in :mod:`kaionb.kernels.launch`); the CTAs of a cluster run at the same time on one GPC
and can read, write and signal each other's shared memory. A multicast TMA copy writes the
same box to the same shared-memory offset of every CTA in ``cta_mask`` and completes the
transaction bytes on the mbarrier at the same offset in each of them.

Lifetime rule: a CTA must not exit while another CTA of its cluster may still access its
shared memory (remote arrivals, multicast writes): end such kernels with
``cluster_arrive(); cluster_wait()`` in every thread.
"""

from numba import types

from ._factory import SM90, ptx_instruction

cluster_ctarank = ptx_instruction(
    "cluster_ctarank",
    "mov.u32 $0, %cluster_ctarank;",
    outputs=types.uint32,
    arch=SM90,
    instruction="mov.u32 %cluster_ctarank",
    doc="``%cluster_ctarank``: this CTA's rank in its cluster (0 .. cluster size - 1).",
)

cluster_id_x = ptx_instruction(
    "cluster_id_x",
    "mov.u32 $0, %clusterid.x;",
    outputs=types.uint32,
    arch=SM90,
    instruction="mov.u32 %clusterid.x",
    doc="``%clusterid.x``: this CTA's cluster's index along x in the grid.",
)

cluster_arrive = ptx_instruction(
    "cluster_arrive",
    "barrier.cluster.arrive.release;",
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``barrier.cluster.arrive.release;``: this thread arrives at the cluster barrier "
    "(its prior writes, shared memory included, are released to the cluster).",
)

cluster_arrive_relaxed = ptx_instruction(
    "cluster_arrive_relaxed",
    "barrier.cluster.arrive.relaxed;",
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``barrier.cluster.arrive.relaxed;``: arrive at the cluster barrier without ordering "
    "this thread's earlier memory accesses: the first half of a start-up barrier whose "
    "``cluster_wait`` comes later (mbarrier inits are published by "
    "``fence_mbarrier_init_cluster``).",
)

cluster_wait = ptx_instruction(
    "cluster_wait",
    "barrier.cluster.wait.acquire;",
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``barrier.cluster.wait.acquire;``: wait until every thread of every CTA in the "
    "cluster has arrived.",
)

fence_mbarrier_init_cluster = ptx_instruction(
    "fence_mbarrier_init_cluster",
    "fence.mbarrier_init.release.cluster;",
    side_effect=True,
    memory=True,
    arch=SM90,
    doc="``fence.mbarrier_init.release.cluster;``: make this thread's ``mbarrier.init`` "
    "visible to the cluster (before other CTAs arrive on or multicast to the barrier).",
)

mbarrier_arrive_remote = ptx_instruction(
    "mbarrier_arrive_remote",
    "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, $0, $1;\n"
    "mbarrier.arrive.shared::cluster.b64 _, [remote]; }",
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
    instruction="mbarrier.arrive.shared::cluster.b64",
    doc="(bar: u32 shared address in this CTA, rank: u32): arrive on the mbarrier at the "
    "same offset in CTA ``rank`` of the cluster (``mapa``, then ``mbarrier.arrive`` with "
    "its default release.cta semantics: enough to say a stage was read, as CUTLASS's "
    "pipelines do).",
)

ld_shared_cluster_f32 = ptx_instruction(
    "ld_shared_cluster_f32",
    "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, $1, $2;\n"
    "ld.shared::cluster.f32 $0, [remote]; }",
    outputs=types.float32,
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
    instruction="ld.shared::cluster.f32",
    doc="(addr: u32 shared address in this CTA, rank: u32) -> f32: the float at the same "
    "offset in CTA ``rank``'s shared memory (distributed shared memory; ``mapa``, then "
    "``ld.shared::cluster``). Order it after the writer's ``cluster_arrive`` with a "
    "``cluster_wait``.",
)

ld_shared_cluster_v4_f32 = ptx_instruction(
    "ld_shared_cluster_v4_f32",
    "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, $4, $5;\n"
    "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [remote]; }",
    outputs=types.UniTuple(types.float32, 4),
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
    instruction="ld.shared::cluster.v4.f32",
    doc="(addr: u32 shared address in this CTA, 16-byte aligned, rank: u32) -> 4×f32: "
    "as :data:`ld_shared_cluster_f32`, four floats in one load.",
)

cp_async_bulk_tensor_2d_multicast = ptx_instruction(
    "cp_async_bulk_tensor_2d_multicast",
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster [$0], [$1, {$2, $3}], [$4], $5;",
    inputs=(types.uint32, types.uint64, types.int32, types.int32, types.uint32, types.uint16),
    side_effect=True,
    memory=True,
    arch=SM90,
    instruction="cp.async.bulk.tensor.2d ... .multicast::cluster",
    doc="(dst, tensor_map, x, y, bar, cta_mask: u16): as "
    ":data:`~kaionb.ptx_patches.cp_async_bulk_tensor_2d_global_to_shared`, writing the "
    "box to offset ``dst`` of every CTA whose rank bit is set in ``cta_mask`` and "
    "completing its bytes on each one's mbarrier at offset ``bar``.",
)


def st_async_cluster_f32(count: int, stride: int):
    """The instruction that sends ``count`` floats (a multiple of 4) into another CTA's
    shared memory: ``(addr: u32, bar: u32, rank: u32, values)``, ``addr`` and ``bar``
    shared addresses in this CTA whose offsets are used in CTA ``rank`` (``mapa``). Chunk
    i (values 4i..4i+3) goes to ``addr + i·stride`` as one 16-byte ``st.async``, which
    completes 16 bytes of transaction on the mbarrier at ``bar``: the receiver announces
    ``4·count`` bytes per sending thread (``mbarrier_arrive_expect_tx``) and waits with
    ``mbarrier_wait_cluster``. The receiver must be running with its barrier
    initialized (a cluster barrier between)."""
    lines = ["{ .reg .b32 to, at;", "mapa.shared::cluster.u32 to, $0, $2;",
             "mapa.shared::cluster.u32 at, $1, $2;"]
    for i in range(count // 4):
        values = ", ".join(f"${3 + 4 * i + e}" for e in range(4))
        lines.append("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 "
                     f"[to+{i * stride}], {{{values}}}, [at];")
    lines.append("}")
    return ptx_instruction(
        f"st_async_cluster_f32_{count}x{stride}",
        "\n".join(lines),
        inputs=(types.uint32, types.uint32, types.uint32, types.UniTuple(types.float32, count)),
        side_effect=True,
        memory=True,
        arch=SM90,
        instruction="st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32",
        doc=f"Send {count} floats into CTA ``rank``'s shared memory, 16 bytes every {stride} "
        "bytes, each completing transaction bytes on its mbarrier (see "
        ":func:`st_async_cluster_f32`).",
    )


def add_shared_f32(count: int, stride: int):
    """The receiving side of :func:`st_async_cluster_f32`: ``(addr: u32, values) ->
    values + the count floats at addr`` (this CTA's shared memory, chunk i at ``addr +
    i·stride``), each sum ``value + loaded`` in f32 (round to nearest)."""
    lines = ["{ .reg .f32 x0, x1, x2, x3;"]
    for i in range(count // 4):
        lines.append(f"ld.shared.v4.f32 {{x0, x1, x2, x3}}, [${count}+{i * stride}];")
        for e in range(4):
            lines.append(f"add.rn.f32 ${4 * i + e}, ${4 * i + e}, x{e};")
    lines.append("}")
    return ptx_instruction(
        f"add_shared_f32_{count}x{stride}",
        "\n".join(lines),
        outputs=types.UniTuple(types.float32, count),
        inputs=(types.uint32, types.UniTuple(types.float32, count)),
        tied=1,
        side_effect=True,
        memory=True,
        instruction="ld.shared.v4.f32",
        doc=f"Add {count} floats loaded from shared memory, 16 bytes every {stride} bytes, "
        "to the values given (see :func:`add_shared_f32`).",
    )
