"""Hopper (sm_90a) warpgroup MMA: ``wgmma.mma_async`` and its fence, commit and wait.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#asynchronous-warpgroup-level-matrix-instructions

wgmma: the four warps of a warpgroup (128 consecutive threads, first warp a multiple of 4)
compute D(64×N, f32) += A(64×16) · B(16×N) with A and B in shared memory, each named by a
64-bit matrix descriptor (:func:`make_smem_desc`). Sequence per k-step: ``wgmma_fence()``
(order register/shared writes before the async op), the mma, ``wgmma_commit_group()``,
and ``wgmma_wait_group(0)`` before reading the accumulator. Shared memory written by
``st.shared`` or ``cp.async`` needs :func:`~kaionb.ptx_patches.fence_proxy_async_shared`
(:mod:`.bulk_copy`) before a wgmma reads it. The accumulator is a tuple of N/2 float32
per thread (:func:`accumulator_zeros` makes the first), updated in place (its registers
are tied to the outputs). Thread ``t`` of warp ``w`` holds, for ``j`` in 0..N/8-1,
elements ``4j..4j+3`` at rows ``16w + t//4`` (``4j``, ``4j+1``) and ``16w + t//4 + 8``
(``4j+2``, ``4j+3``), columns ``8j + 2·(t%4)`` and ``+1`` — the m16n8 C layout repeated
along N. The epilogue's stores of that layout are in :mod:`.accumulator_store`.

Compile for sm_90a: ``cuda.compile_ptx(..., cc=(9, 0, "a"))``; a kernel launched through
numba on an sm_90 device is assembled for sm_90a already (numba adds the ``a`` when it
links for the current device). Compiling these for sm_80/89 raises
:class:`~kaionb.ptx_patches.ArchitectureError` naming the instruction.
"""

from llvmlite import ir
from numba import config, types
from numba.cuda.extending import intrinsic

from ._factory import IMM, SM90A, device_function, ptx_instruction


def _wgmma(n: int, ab: str, a_in_registers: bool = False):
    """m64nN wgmma of one 32-byte k-step: k16 f32 += f16/bf16, or k32 s32 += s8; A from
    shared memory (a descriptor) or, ``a_in_registers`` (16-bit only), as each warp's 16
    rows in the four 32-bit registers of an ``mma.sync`` m16n8k16 A fragment."""
    integer = ab == "s8"
    shape = f"m64n{n}k32.s32.s8.s8" if integer else f"m64n{n}k16.f32.{ab}.{ab}"
    ptx = f"wgmma.mma_async.sync.aligned.{shape}"
    count = n // 2
    acc = ", ".join(f"${i}" for i in range(count))
    element = types.int32 if integer else types.float32
    acc_type = types.UniTuple(element, count)
    name = f"wgmma_m64n{n}k32_s32_s8" if integer else f"wgmma_m64n{n}k16_f32_{ab}"
    if a_in_registers:
        # $count..$count+3: A; $count+4: B's descriptor; $count+5: scale-d; $count+6: the
        # transpose immediate of B (a register A has none).
        a_operand, b_operand, scale_d = (
            f"{{${count}, ${count + 1}, ${count + 2}, ${count + 3}}}", f"${count + 4}",
            count + 5)
        operands = f"p, 1, 1, ${count + 6}"
        inputs = (types.UniTuple(types.uint32, 4), types.uint64, types.uint32, IMM, acc_type)
        name += "_rs"
        doc = (f"``{ptx}`` with A from registers: (a: 4×u32, desc_b: u64, scale_d: u32, "
               f"trans_b: const, acc: {count}×float32) -> acc. A is the lane's m16n8k16 A "
               "fragment of its warp's 16 rows (FlashAttention's P); trans_b 1: B N-major.")
    else:
        # $count, $count+1: descriptors; $count+2: scale-d (0 → D = A·B, else D += A·B);
        # $count+3, $count+4: the transpose immediates of A and B (1: the tile is
        # M/N-major). Integer wgmma has no transpose (both tiles K-major) and no negation
        # immediates: the two trans operands are accepted and unused (one call shape for
        # every operand type).
        a_operand, b_operand, scale_d = f"${count}", f"${count + 1}", count + 2
        operands = "p" if integer else f"p, 1, 1, ${count + 3}, ${count + 4}"
        inputs = (types.uint64, types.uint64, types.uint32, IMM, IMM, acc_type)
        trans = ("trans 0 only: both tiles K-major; wrapping s32 accumulation" if integer
                 else "trans 0: the operand's tile is K-major in shared memory; 1: M-major "
                 "(A) / N-major (B)")
        doc = (f"``{ptx}``: (desc_a: u64, desc_b: u64, scale_d: u32, trans_a: const, "
               f"trans_b: const, acc: {count}×{element}) -> acc. {trans}. scale_d = 0 "
               "ignores acc.")
    template = (
        f"{{ .reg .pred p; setp.ne.b32 p, ${scale_d}, 0;\n"
        f" {ptx} {{{acc}}}, {a_operand}, {b_operand}, {operands}; }}"
    )
    return ptx_instruction(
        name,
        template,
        outputs=acc_type,
        inputs=inputs,
        tied=len(inputs) - 1,
        side_effect=True,
        memory=True,
        arch=SM90A,
        instruction=ptx,
        doc=doc,
    )


wgmma_m64n64k16_f32_f16 = _wgmma(64, "f16")
wgmma_m64n128k16_f32_f16 = _wgmma(128, "f16")
wgmma_m64n256k16_f32_f16 = _wgmma(256, "f16")
wgmma_m64n64k16_f32_bf16 = _wgmma(64, "bf16")
wgmma_m64n128k16_f32_bf16 = _wgmma(128, "bf16")
wgmma_m64n256k16_f32_bf16 = _wgmma(256, "bf16")
wgmma_m64n128k32_s32_s8 = _wgmma(128, "s8")
wgmma_m64n256k32_s32_s8 = _wgmma(256, "s8")
wgmma_m64n64k16_f32_f16_rs = _wgmma(64, "f16", a_in_registers=True)
wgmma_m64n128k16_f32_f16_rs = _wgmma(128, "f16", a_in_registers=True)
wgmma_m64n256k16_f32_f16_rs = _wgmma(256, "f16", a_in_registers=True)
wgmma_m64n64k16_f32_bf16_rs = _wgmma(64, "bf16", a_in_registers=True)
wgmma_m64n128k16_f32_bf16_rs = _wgmma(128, "bf16", a_in_registers=True)
wgmma_m64n256k16_f32_bf16_rs = _wgmma(256, "bf16", a_in_registers=True)

wgmma_fence = ptx_instruction(
    "wgmma_fence",
    "wgmma.fence.sync.aligned;",
    side_effect=True,
    memory=True,
    arch=SM90A,
    doc="``wgmma.fence.sync.aligned;``: order prior accumulator/shared writes before wgmma.",
)

wgmma_commit_group = ptx_instruction(
    "wgmma_commit_group",
    "wgmma.commit_group.sync.aligned;",
    side_effect=True,
    memory=True,
    arch=SM90A,
    doc="``wgmma.commit_group.sync.aligned;``: close the group of issued wgmmas.",
)

wgmma_wait_group = ptx_instruction(
    "wgmma_wait_group",
    "wgmma.wait_group.sync.aligned $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    arch=SM90A,
    doc="``wgmma.wait_group.sync.aligned N;``: wait until at most N groups are pending.",
)



def wgmma_wait_group_holding(words: int):
    """``wgmma.wait_group.sync.aligned N`` that also takes ``words`` 32-bit registers as
    (unused) operands: ``(N: const, regs: words×u32)``. Passing a register-A wgmma's A
    here keeps those registers live, so nothing reuses them while the wgmma may still
    read them — else ptxas serializes every wgmma of the kernel (warning C7513)."""
    return ptx_instruction(
        f"wgmma_wait_group_holding_{words}",
        "wgmma.wait_group.sync.aligned $0;",
        inputs=(IMM, types.UniTuple(types.uint32, words)),
        side_effect=True,
        memory=True,
        arch=SM90A,
        doc=f"``wgmma.wait_group.sync.aligned N;`` holding {words} registers until it "
        "returns.",
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


def _zeros_typer(element, llvm_zero):
    def typer(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            return None
        acc_type = types.UniTuple(element, n.literal_value)

        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, acc_type, [llvm_zero] * n.literal_value)

        return acc_type(n), codegen

    return typer


if config.ENABLE_CUDASIM:

    def accumulator_zeros(n):
        """A tuple of ``n`` float32 zeros."""
        return (0.0,) * n

    def accumulator_zeros_s32(n):
        """A tuple of ``n`` int32 zeros."""
        return (0,) * n

else:
    accumulator_zeros = intrinsic(_zeros_typer(types.float32, ir.Constant(ir.FloatType(), 0.0)))
    accumulator_zeros.__doc__ = (
        "A tuple of ``n`` (a constant) float32 zeros: the initial wgmma accumulator "
        "(numba-cuda cannot multiply tuples in a kernel). No PTX."
    )
    accumulator_zeros_s32 = intrinsic(_zeros_typer(types.int32, ir.Constant(ir.IntType(32), 0)))
    accumulator_zeros_s32.__doc__ = "As :func:`accumulator_zeros` for an s32 accumulator."
