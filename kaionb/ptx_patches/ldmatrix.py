"""``ldmatrix``: load 8×8 b16 matrices from shared memory into mma fragments (sm_75+).

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#warp-level-matrix-instructions-ldmatrix

``.xN`` loads N matrices. Lanes 8·j .. 8·j+7 give the shared addresses (32-bit, see
:func:`kaionb.ptx_patches.shared_addr`) of the 8 rows of matrix j (16 bytes each; lanes
that name no matrix pass any valid address). Register j of lane ``l`` receives row
``l // 4``, columns ``2·(l % 4)`` and ``+1`` of matrix j (low half first); with
``.trans`` it receives that pair from the transposed matrix (rows ``2·(l % 4)``, ``+1`` of
column ``l // 4``).

Loads from shared memory: marked side-effecting with a memory clobber so they stay after
the barrier that made the data visible.
"""

from numba import types

from ._factory import ptx_instruction


def _ldmatrix(count: int, trans: bool):
    suffix = ".trans" if trans else ""
    ptx = f"ldmatrix.sync.aligned.m8n8.x{count}{suffix}.shared.b16"
    regs = ", ".join(f"${i}" for i in range(count))
    return ptx_instruction(
        f"ldmatrix_x{count}{'_trans' if trans else ''}",
        f"{ptx} {{{regs}}}, [${count}];",
        outputs=types.UniTuple(types.uint32, count) if count > 1 else types.uint32,
        inputs=(types.uint32,),
        side_effect=True,
        memory=True,
        doc=f"``{ptx}``: (shared address: u32) -> {count}× b16x2 (uint32).",
    )


ldmatrix_x1 = _ldmatrix(1, trans=False)
ldmatrix_x2 = _ldmatrix(2, trans=False)
ldmatrix_x4 = _ldmatrix(4, trans=False)
ldmatrix_x1_trans = _ldmatrix(1, trans=True)
ldmatrix_x2_trans = _ldmatrix(2, trans=True)
ldmatrix_x4_trans = _ldmatrix(4, trans=True)
