"""Warp-specialization controls: named barriers and warpgroup register reallocation.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-bar
(``setmaxnreg``, sm_90a: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#miscellaneous-instructions-setmaxnreg).

A warp-specialized kernel splits its block into roles (a producer warpgroup that issues
TMA loads, consumer warpgroups that run wgmma). ``bar_sync_threads(id, count)``
synchronizes only the ``count`` threads of one role, where ``cuda.syncthreads()`` would
stall the whole block; ``setmaxnreg_dec`` / ``setmaxnreg_inc`` move registers from the
producer, which needs few, to the consumers, which hold the accumulators. Both are
``.sync.aligned``: every thread of the warp (for setmaxnreg, of the warpgroup) executes
the same instruction.
"""

from ._factory import IMM, SM90A, ptx_instruction

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
    arch=SM90A,
    doc="``setmaxnreg.inc.sync.aligned.u32 N;``: raise this warpgroup's registers per "
    "thread to N (24-256, a multiple of 8), from the pool others released.",
)

setmaxnreg_dec = ptx_instruction(
    "setmaxnreg_dec",
    "setmaxnreg.dec.sync.aligned.u32 $0;",
    inputs=(IMM,),
    side_effect=True,
    arch=SM90A,
    doc="``setmaxnreg.dec.sync.aligned.u32 N;``: lower this warpgroup's registers per "
    "thread to N and release the rest to the block's pool.",
)
