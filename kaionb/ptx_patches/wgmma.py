"""Hopper (sm_90a): warpgroup MMA, async-proxy fence, mbarrier, bulk copies.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions
mbarrier: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier
cp.async.bulk: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async-bulk

wgmma: the four warps of a warpgroup (128 consecutive threads, first warp a multiple of 4)
compute D(64×N, f32) += A(64×16) · B(16×N) with A and B in shared memory, each named by a
64-bit matrix descriptor (:func:`make_smem_desc`). Sequence per k-step: ``wgmma_fence()``
(order register/shared writes before the async op), the mma, ``wgmma_commit_group()``,
and ``wgmma_wait_group(0)`` before reading the accumulator. The accumulator is a tuple of
N/2 float32 per thread, updated in place (its registers are tied to the outputs). Thread
``t`` of warp ``w`` holds, for ``j`` in 0..N/8-1, elements ``4j..4j+3`` at rows
``16w + t//4`` (``4j``, ``4j+1``) and ``16w + t//4 + 8`` (``4j+2``, ``4j+3``), columns
``8j + 2·(t%4)`` and ``+1`` — the m16n8 C layout repeated along N.

Compile for sm_90a: ``cuda.compile_ptx(..., cc=(9, 0, "a"))``; a kernel launched through
numba on an sm_90 device is assembled for sm_90a already (numba adds the ``a`` when it
links for the current device). Compiling these for sm_80/89 raises
:class:`~kaionb.ptx_patches.ArchitectureError` naming the instruction.

TMA (``cp.async.bulk.tensor``): the CUDA idiom passes the 128-byte CUtensorMap as a
``const __grid_constant__`` kernel parameter; numba has no way to declare one (kernel
arguments are numba types, and there is no 128-byte opaque by-value parameter nor the
``.param`` address it would need). kaionb encodes the map on the host
(``cuTensorMapEncodeTiled``, :mod:`kaionb._tensor_map`), copies it into global memory and
passes its generic address as a uint64 (the ISA accepts a tensor map in the global state
space; prefetch it with ``prefetch.tensormap``): the loads and stores of
:mod:`kaionb.kernels.matmul_hopper` run this way on the H100. The 1-D bulk copy
``cp.async.bulk`` needs no map. Cluster instructions (multicast TMA, remote mbarrier
arrive) are in :mod:`.cluster`.
"""

from llvmlite import ir
from numba import config, types
from numba.cuda.extending import intrinsic

from ._factory import IMM, device_function, ptx_instruction

_SM90A = (lambda cc: cc == (9, 0), "sm_90a")
_SM90 = (lambda cc: cc >= (9, 0), "sm_90 or newer")


def _wgmma(n: int, ab: str):
    ptx = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab}"
    count = n // 2
    acc = ", ".join(f"${i}" for i in range(count))
    # $count, $count+1: descriptors; $count+2: scale-d (0 → D = A·B, else D += A·B);
    # $count+3, $count+4: the transpose immediates of A and B (1: the tile is M/N-major).
    template = (
        f"{{ .reg .pred p; setp.ne.b32 p, ${count + 2}, 0;\n"
        f" {ptx} {{{acc}}}, ${count}, ${count + 1}, p, 1, 1, ${count + 3}, ${count + 4}; }}"
    )
    acc_type = types.UniTuple(types.float32, count)
    return ptx_instruction(
        f"wgmma_m64n{n}k16_f32_{ab}",
        template,
        outputs=acc_type,
        inputs=(types.uint64, types.uint64, types.uint32, IMM, IMM, acc_type),
        tied=5,
        side_effect=True,
        memory=True,
        arch=_SM90A,
        instruction=ptx,
        doc=f"``{ptx}``: (desc_a: u64, desc_b: u64, scale_d: u32, trans_a: const, "
        f"trans_b: const, acc: {count}×f32) -> acc. trans 0: the operand's tile is K-major "
        f"in shared memory; 1: M-major (A) / N-major (B). scale_d = 0 ignores acc.",
    )


wgmma_m64n64k16_f32_f16 = _wgmma(64, "f16")
wgmma_m64n128k16_f32_f16 = _wgmma(128, "f16")
wgmma_m64n256k16_f32_f16 = _wgmma(256, "f16")
wgmma_m64n64k16_f32_bf16 = _wgmma(64, "bf16")
wgmma_m64n128k16_f32_bf16 = _wgmma(128, "bf16")
wgmma_m64n256k16_f32_bf16 = _wgmma(256, "bf16")


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


def st_global_accumulator(n: int, kind: str):
    """The instruction that stores an m64nN f32 wgmma accumulator straight to a row-major
    global output, in ``kind`` ("f32", "f16" or "bf16", round to nearest even):
    ``(addr0: u64, addr8: u64, row0_ok: u32, row8_ok: u32, cols_left: i32, acc)``.
    ``addr0`` / ``addr8`` address this thread's first pair in rows ``16·warp + lane/4`` and
    8 rows below, column ``2·(lane%4)``; pair j (8j columns further) is stored where
    ``8j < cols_left`` and its row's flag is set — the output's columns must come in
    aligned pairs (even N, 8-byte-aligned f32 / 4-byte-aligned 16-bit rows)."""
    count = n // 2
    width = 4 if kind == "f32" else 2  # bytes per element
    lines = ["{ .reg .pred r0, r8, c, p; .reg .b32 h;",
             "setp.ne.b32 r0, $2, 0;", "setp.ne.b32 r8, $3, 0;"]
    for j in range(n // 8):
        off = 8 * width * j
        lines.append(f"setp.gt.s32 c, $4, {8 * j};")
        for base, pred, lo, hi in (("$0", "r0", 4 * j + 5, 4 * j + 6),
                                   ("$1", "r8", 4 * j + 7, 4 * j + 8)):
            lines.append(f"and.pred p, c, {pred};")
            if kind == "f32":
                lines.append(f"@p st.global.v2.f32 [{base}+{off}], {{${lo}, ${hi}}};")
            else:
                lines.append(f"cvt.rn.{kind}x2.f32 h, ${hi}, ${lo};")
                lines.append(f"@p st.global.b32 [{base}+{off}], h;")
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


wgmma_fence = ptx_instruction(
    "wgmma_fence",
    "wgmma.fence.sync.aligned;",
    side_effect=True,
    memory=True,
    arch=_SM90A,
    doc="``wgmma.fence.sync.aligned;``: order prior accumulator/shared writes before wgmma.",
)

wgmma_commit_group = ptx_instruction(
    "wgmma_commit_group",
    "wgmma.commit_group.sync.aligned;",
    side_effect=True,
    memory=True,
    arch=_SM90A,
    doc="``wgmma.commit_group.sync.aligned;``: close the group of issued wgmmas.",
)

wgmma_wait_group = ptx_instruction(
    "wgmma_wait_group",
    "wgmma.wait_group.sync.aligned $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    arch=_SM90A,
    doc="``wgmma.wait_group.sync.aligned N;``: wait until at most N groups are pending.",
)

fence_proxy_async_shared = ptx_instruction(
    "fence_proxy_async_shared",
    "fence.proxy.async.shared::cta;",
    side_effect=True,
    memory=True,
    arch=_SM90,
    doc="``fence.proxy.async.shared::cta;``: make generic-proxy shared-memory writes "
    "(st.shared, cp.async) visible to the async proxy (wgmma, bulk copies).",
)

mbarrier_init = ptx_instruction(
    "mbarrier_init",
    "mbarrier.init.shared::cta.b64 [$0], $1;",
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=_SM90,
    doc="``mbarrier.init.shared::cta.b64 [bar], count;`` (bar: u32 shared address of a "
    "uint64, count: arrivals per phase).",
)

mbarrier_arrive = ptx_instruction(
    "mbarrier_arrive",
    "mbarrier.arrive.shared::cta.b64 $0, [$1];",
    outputs=types.uint64,
    inputs=(types.uint32,),
    side_effect=True,
    memory=True,
    arch=_SM90,
    doc="``mbarrier.arrive.shared::cta.b64 state, [bar];`` -> the phase state (u64).",
)

mbarrier_arrive_expect_tx = ptx_instruction(
    "mbarrier_arrive_expect_tx",
    "mbarrier.arrive.expect_tx.shared::cta.b64 $0, [$1], $2;",
    outputs=types.uint64,
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=_SM90,
    doc="``mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx_bytes;``: arrive "
    "and expect ``tx_bytes`` more bytes from async copies before the phase completes.",
)

mbarrier_try_wait_parity = ptx_instruction(
    "mbarrier_try_wait_parity",
    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
    "selp.u32 $0, 1, 0, p; }",
    outputs=types.uint32,
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=_SM90,
    instruction="mbarrier.try_wait.parity.shared::cta.b64",
    doc="``mbarrier.try_wait.parity.shared::cta.b64``: (bar, parity) -> 1 once the phase "
    "with that parity has completed, else 0 after a hardware timeout; loop on it.",
)

mbarrier_wait = ptx_instruction(
    "mbarrier_wait",
    "{ .reg .pred p;\nwait:\n"
    "mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n"
    "@!p bra wait;\n}",
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=_SM90,
    instruction="mbarrier.try_wait.parity.shared::cta.b64",
    doc="Spin on ``mbarrier.try_wait.parity`` until the phase of ``bar`` with parity "
    "``parity`` has completed: (bar, parity). The loop is inside the asm, so the compiler "
    "sees no divergent branch (ptxas serializes wgmma after branches it cannot prove "
    "warp-uniform).",
)

cp_async_bulk_global_to_shared = ptx_instruction(
    "cp_async_bulk_global_to_shared",
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
    inputs=(types.uint32, types.uint64, types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=_SM90,
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
    arch=_SM90,
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
    arch=_SM90,
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
    arch=_SM90,
    doc="``cp.async.bulk.commit_group;``: close this thread's group of bulk stores.",
)

cp_async_bulk_wait_group_read = ptx_instruction(
    "cp_async_bulk_wait_group_read",
    "cp.async.bulk.wait_group.read $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    arch=_SM90,
    doc="``cp.async.bulk.wait_group.read N;``: wait until at most N of this thread's bulk "
    "groups still read their shared-memory source (the buffer may then be rewritten).",
)

cp_async_bulk_wait_group = ptx_instruction(
    "cp_async_bulk_wait_group",
    "cp.async.bulk.wait_group $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    arch=_SM90,
    doc="``cp.async.bulk.wait_group N;``: wait until at most N of this thread's bulk "
    "groups are pending (their writes done).",
)

bar_sync_threads = ptx_instruction(
    "bar_sync_threads",
    "bar.sync $0, $1;",
    inputs=(IMM, IMM),
    side_effect=True,
    memory=True,
    instruction="bar.sync",
    doc="``bar.sync id, count;``: named barrier ``id`` (1-15; 0 is ``syncthreads``) for "
    "``count`` threads (a multiple of 32): synchronizes a subset of the block's warps.",
)

setmaxnreg_inc = ptx_instruction(
    "setmaxnreg_inc",
    "setmaxnreg.inc.sync.aligned.u32 $0;",
    inputs=(IMM,),
    side_effect=True,
    arch=_SM90A,
    doc="``setmaxnreg.inc.sync.aligned.u32 N;``: raise this warpgroup's registers per "
    "thread to N (24-256, a multiple of 8), from the pool others released.",
)

setmaxnreg_dec = ptx_instruction(
    "setmaxnreg_dec",
    "setmaxnreg.dec.sync.aligned.u32 $0;",
    inputs=(IMM,),
    side_effect=True,
    arch=_SM90A,
    doc="``setmaxnreg.dec.sync.aligned.u32 N;``: lower this warpgroup's registers per "
    "thread to N and release the rest to the block's pool.",
)

prefetch_tensormap = ptx_instruction(
    "prefetch_tensormap",
    "prefetch.tensormap [$0];",
    inputs=(types.uint64,),
    side_effect=True,
    arch=_SM90,
    doc="``prefetch.tensormap [addr];``: bring a tensor map in global memory into cache.",
)


@device_function
def make_smem_desc(saddr, leading_bytes, stride_bytes, swizzle_bytes):
    """The 64-bit wgmma shared-memory descriptor of a tile at ``saddr``.

    Fields (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4; 16-29
    leading-dimension byte offset >> 4; 32-45 stride byte offset >> 4; 62-63 swizzle
    (1: 128-byte, 2: 64-byte, 3: 32-byte, 0: none). With the 128-byte swizzle and 16-bit
    elements (rows of 64 elements, 128 bytes; tiles start on 1024-byte boundaries):

    - K-major tile (:func:`kaionb.kernels.helpers.tiles.swizzle_128b`, or a TMA box of
      64 K × rows): ``stride_bytes = 1024`` (8 rows), ``leading_bytes`` unused (16);
      the k-step of 16 advances ``saddr`` by 32 bytes.
    - M/N-major tile (``trans`` = 1; TMA boxes of 64 M/N × 64 K rows, one after another):
      ``stride_bytes = 1024`` (8 K rows), ``leading_bytes`` = the bytes from one 64-wide
      M/N block to the next (8192 for 64-row boxes); the k-step of 16 advances 2048 bytes.
    """
    mode = 0
    if swizzle_bytes == 128:
        mode = 1
    elif swizzle_bytes == 64:
        mode = 2
    elif swizzle_bytes == 32:
        mode = 3
    desc = types.uint64((saddr & 0x3FFFF) >> 4)
    desc |= types.uint64((leading_bytes & 0x3FFFF) >> 4) << 16
    desc |= types.uint64((stride_bytes & 0x3FFFF) >> 4) << 32
    desc |= types.uint64(mode) << 62
    return desc


def _accumulator_zeros_typer(typingctx, n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    acc_type = types.UniTuple(types.float32, n.literal_value)

    def codegen(context, builder, sig, args):
        zero = ir.Constant(ir.FloatType(), 0.0)
        return context.make_tuple(builder, acc_type, [zero] * n.literal_value)

    return acc_type(n), codegen


if config.ENABLE_CUDASIM:

    def accumulator_zeros(n):
        """A tuple of ``n`` float32 zeros."""
        return (0.0,) * n

else:
    accumulator_zeros = intrinsic(_accumulator_zeros_typer)
    accumulator_zeros.__doc__ = (
        "A tuple of ``n`` (a constant) float32 zeros: the initial wgmma accumulator "
        "(numba-cuda cannot multiply tuples in a kernel). No PTX."
    )
