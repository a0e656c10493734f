"""``cp.async``: asynchronous global → shared copies (sm_80+).

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-cp-async

``cp_async_ca_16(dst, src, src_size)`` copies ``src_size`` bytes from the global address
``src`` (uint64, see :func:`kaionb.ptx_patches.global_addr`) to the shared address ``dst``
(uint32, see :func:`kaionb.ptx_patches.shared_addr`) and fills the rest of the 16 bytes
with zeros: ``src_size = 0`` zero-fills a destination whose source is out of bounds (the
source address must still be a valid one; pass the tensor's base). ``.ca`` caches in L1
and L2, ``.cg`` in L2 only, and the ISA allows ``.cg`` for 16 bytes only.

Copies issued since the last ``commit_group`` form one group; ``wait_group N`` waits until
at most N groups are pending (N is a compile-time constant), ``wait_all`` waits for all.
A ``cuda.syncthreads()`` is still needed before other threads read the data.
"""

from numba import types

from ._factory import IMM, ptx_instruction


def _cp_async(cache: str, size: int):
    ptx = f"cp.async.{cache}.shared.global"
    return ptx_instruction(
        f"cp_async_{cache}_{size}",
        f"{ptx} [$0], [$1], {size}, $2;",
        inputs=(types.uint32, types.uint64, types.uint32),
        side_effect=True,
        memory=True,
        doc=f"``{ptx} [dst], [src], {size}, src_size;`` "
        f"(dst: u32 shared, src: u64 global, src_size: bytes to read, 0..{size}).",
    )


cp_async_ca_4 = _cp_async("ca", 4)
cp_async_ca_8 = _cp_async("ca", 8)
cp_async_ca_16 = _cp_async("ca", 16)
cp_async_cg_16 = _cp_async("cg", 16)

cp_async_commit_group = ptx_instruction(
    "cp_async_commit_group",
    "cp.async.commit_group;",
    side_effect=True,
    memory=True,
    doc="``cp.async.commit_group;``: close the current group of copies.",
)

cp_async_wait_group = ptx_instruction(
    "cp_async_wait_group",
    "cp.async.wait_group $0;",
    inputs=(IMM,),
    side_effect=True,
    memory=True,
    doc="``cp.async.wait_group N;``: wait until at most N (a constant) groups are pending.",
)

cp_async_wait_all = ptx_instruction(
    "cp_async_wait_all",
    "cp.async.wait_all;",
    side_effect=True,
    memory=True,
    doc="``cp.async.wait_all;``: wait for every copy this thread issued.",
)
