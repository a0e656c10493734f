"""Addresses and 128-bit vector memory access.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-ld
(and ``st``, ``ld.global.nc``).

Addresses: PTX memory instructions here take raw addresses, not numba arrays.
``global_addr(arr, i)`` is the 64-bit address of element ``i`` (numba's array pointers are
generic addresses, which equal global addresses on every CUDA GPU).
``shared_addr(arr, i)`` is the 32-bit shared-window address of element ``i`` of a
``cuda.shared.array``: ``addrspacecast`` to address space 3, ``ptrtoint``, ``trunc`` to
i32 — the form ldmatrix, cp.async, mbarrier and wgmma descriptors expect. Both accept a
scalar index for 1-D arrays or a tuple for N-D arrays (no wraparound, no bounds check).

Vector access moves four 32-bit words in one instruction; the address must be 16-byte
aligned. Loads that must not be reordered with stores or barriers are side-effecting with
a memory clobber; ``ld.global.nc`` (read-only data for the kernel's lifetime) is left free
for the scheduler.
"""

from llvmlite import ir
from numba import config, types
from numba.cuda import cgutils
from numba.cuda.api_util import normalize_indices
from numba.cuda.core.errors import NumbaTypeError
from numba.cuda.extending import intrinsic

from ._factory import ptx_instruction, simulator_stub

_U32x2 = types.UniTuple(types.uint32, 2)
_U32x4 = types.UniTuple(types.uint32, 4)
_F32x4 = types.UniTuple(types.float32, 4)


def _element_pointer(context, builder, array_type, array, index_type, index):
    index_type, indices = normalize_indices(
        context, builder, index_type, index, array_type, array_type.dtype
    )
    ary = context.make_array(array_type)(context, builder, value=array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, indices)


def _check_array_index(name, array, index):
    if not isinstance(array, types.Array):
        raise NumbaTypeError(f"{name} takes an array, got {array}")
    ok = isinstance(index, types.Integer) and array.ndim == 1
    ok |= isinstance(index, types.UniTuple) and index.count == array.ndim and isinstance(
        index.dtype, types.Integer
    )
    if not ok:
        raise NumbaTypeError(f"{name}: {index} is not a valid index for {array}")


def _global_addr(typingctx, array, index):
    _check_array_index("global_addr", array, index)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.ptrtoint(ptr, ir.IntType(64))

    return types.uint64(array, index), codegen


def _shared_addr(typingctx, array, index):
    _check_array_index("shared_addr", array, index)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        shared_ptr = builder.addrspacecast(ptr, ptr.type.pointee.as_pointer(3))
        return builder.trunc(builder.ptrtoint(shared_ptr, ir.IntType(64)), ir.IntType(32))

    return types.uint32(array, index), codegen


_GLOBAL_DOC = "The 64-bit (generic = global) address of ``array[index]`` as uint64."
_SHARED_DOC = (
    "The 32-bit shared-memory address of ``array[index]`` (a cuda.shared.array): "
    "addrspacecast to addrspace(3), ptrtoint, trunc to i32."
)
if config.ENABLE_CUDASIM:
    global_addr = simulator_stub("global_addr", "a raw global address", _GLOBAL_DOC)
    shared_addr = simulator_stub("shared_addr", "a raw shared address", _SHARED_DOC)
else:
    global_addr = intrinsic(_global_addr)
    global_addr.__doc__ = _GLOBAL_DOC
    shared_addr = intrinsic(_shared_addr)
    shared_addr.__doc__ = _SHARED_DOC


ld_global_v4_u32 = ptx_instruction(
    "ld_global_v4_u32",
    "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];",
    outputs=_U32x4,
    inputs=(types.uint64,),
    side_effect=True,
    memory=True,
    doc="``ld.global.v4.u32``: (address: u64, 16-byte aligned) -> 4×u32.",
)

ld_global_nc_v4_u32 = ptx_instruction(
    "ld_global_nc_v4_u32",
    "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];",
    outputs=_U32x4,
    inputs=(types.uint64,),
    doc="``ld.global.nc.v4.u32``: read-only (non-coherent) path; the data must not "
    "change while the kernel runs. (address: u64) -> 4×u32.",
)

ld_global_nc_stream_v4_u32 = ptx_instruction(
    "ld_global_nc_stream_v4_u32",
    "ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {$0, $1, $2, $3}, [$4];",
    outputs=_U32x4,
    inputs=(types.uint64,),
    doc="``ld.global.nc.L1::no_allocate.L2::256B.v4.u32``: read-only data read once, in "
    "order: no L1 line (it would evict data other loads reuse), and L2 fetches the whole "
    "aligned 256-byte block (the stream's next loads hit it). (address: u64) -> 4×u32.",
)

ld_global_nc_v2_u32 = ptx_instruction(
    "ld_global_nc_v2_u32",
    "ld.global.nc.v2.u32 {$0, $1}, [$2];",
    outputs=_U32x2,
    inputs=(types.uint64,),
    doc="``ld.global.nc.v2.u32``: read-only path. (address: u64, 8-byte aligned) -> 2×u32.",
)

ld_global_v4_f32 = ptx_instruction(
    "ld_global_v4_f32",
    "ld.global.v4.f32 {$0, $1, $2, $3}, [$4];",
    outputs=_F32x4,
    inputs=(types.uint64,),
    side_effect=True,
    memory=True,
    doc="``ld.global.v4.f32``: (address: u64, 16-byte aligned) -> 4×f32.",
)

ld_global_nc_v4_f32 = ptx_instruction(
    "ld_global_nc_v4_f32",
    "ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$4];",
    outputs=_F32x4,
    inputs=(types.uint64,),
    doc="``ld.global.nc.v4.f32``: read-only path. (address: u64) -> 4×f32.",
)

ld_global_nc_f32 = ptx_instruction(
    "ld_global_nc_f32",
    "ld.global.nc.f32 $0, [$1];",
    outputs=types.float32,
    inputs=(types.uint64,),
    doc="``ld.global.nc.f32``: read-only path. (address: u64) -> f32.",
)

ld_global_nc_u32 = ptx_instruction(
    "ld_global_nc_u32",
    "ld.global.nc.u32 $0, [$1];",
    outputs=types.uint32,
    inputs=(types.uint64,),
    doc="``ld.global.nc.u32``: read-only path. (address: u64) -> u32.",
)

st_global_v2_u32 = ptx_instruction(
    "st_global_v2_u32",
    "st.global.v2.u32 [$0], {$1, $2};",
    inputs=(types.uint64, _U32x2),
    side_effect=True,
    memory=True,
    doc="``st.global.v2.u32``: (address: u64, 8-byte aligned, values: 2×u32).",
)

st_global_v4_u32 = ptx_instruction(
    "st_global_v4_u32",
    "st.global.v4.u32 [$0], {$1, $2, $3, $4};",
    inputs=(types.uint64, _U32x4),
    side_effect=True,
    memory=True,
    doc="``st.global.v4.u32``: (address: u64, values: 4×u32).",
)

st_global_b32 = ptx_instruction(
    "st_global_b32",
    "st.global.b32 [$0], $1;",
    inputs=(types.uint64, types.uint32),
    side_effect=True,
    memory=True,
    doc="``st.global.b32``: store one 32-bit word, e.g. two packed halves "
    "(address: u64, 4-byte aligned).",
)

st_global_v4_f32 = ptx_instruction(
    "st_global_v4_f32",
    "st.global.v4.f32 [$0], {$1, $2, $3, $4};",
    inputs=(types.uint64, _F32x4),
    side_effect=True,
    memory=True,
    doc="``st.global.v4.f32``: (address: u64, values: 4×f32).",
)

ld_shared_v4_u32 = ptx_instruction(
    "ld_shared_v4_u32",
    "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];",
    outputs=_U32x4,
    inputs=(types.uint32,),
    side_effect=True,
    memory=True,
    doc="``ld.shared.v4.u32``: (shared address: u32) -> 4×u32.",
)

st_shared_v4_u32 = ptx_instruction(
    "st_shared_v4_u32",
    "st.shared.v4.u32 [$0], {$1, $2, $3, $4};",
    inputs=(types.uint32, _U32x4),
    side_effect=True,
    memory=True,
    doc="``st.shared.v4.u32``: (shared address: u32, values: 4×u32).",
)

ld_shared_v2_u32 = ptx_instruction(
    "ld_shared_v2_u32",
    "ld.shared.v2.u32 {$0, $1}, [$2];",
    outputs=_U32x2,
    inputs=(types.uint32,),
    side_effect=True,
    memory=True,
    doc="``ld.shared.v2.u32``: (shared address: u32, 8-byte aligned) -> 2×u32.",
)

st_shared_v2_u32 = ptx_instruction(
    "st_shared_v2_u32",
    "st.shared.v2.u32 [$0], {$1, $2};",
    inputs=(types.uint32, _U32x2),
    side_effect=True,
    memory=True,
    doc="``st.shared.v2.u32``: (shared address: u32, values: 2×u32).",
)
