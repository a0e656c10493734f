"""Shared-memory barriers with transaction counts (sm_90): ``mbarrier``.

PTX ISA: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier

An mbarrier is a uint64 in shared memory, named by its 32-bit shared address
(:func:`~kaionb.ptx_patches.shared_addr`). ``mbarrier_init(bar, count)`` sets the number
of arrivals per phase; a phase completes when ``count`` threads have arrived and every
byte announced with ``mbarrier_arrive_expect_tx`` has been delivered by the async copies
that signal it (:mod:`.bulk_copy`). Phases alternate parity 0, 1, 0, ...: a consumer
waits on the parity of the phase it needs (``mbarrier_wait`` or a loop on
``mbarrier_try_wait_parity``; ``mbarrier_wait_cluster`` for phases completed by another
CTA). The cluster forms (arrive on another CTA's barrier, ``fence.mbarrier_init``) are in
:mod:`.cluster`.
"""

from numba import types

from ._factory import SM90, ptx_instruction

mbarrier_init = ptx_instruction(
    "mbarrier_init",
    "mbarrier.init.shared::cta.b64 [$0], $1;",
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
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
    arch=SM90,
    doc="``mbarrier.arrive.shared::cta.b64 state, [bar];`` -> the phase state (u64).",
)

mbarrier_arrive_expect_tx = ptx_instruction(
    "mbarrier_arrive_expect_tx",
    "mbarrier.arrive.expect_tx.shared::cta.b64 $0, [$1], $2;",
    outputs=types.uint64,
    inputs=(types.uint32, types.uint32),
    side_effect=True,
    memory=True,
    arch=SM90,
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
    arch=SM90,
    instruction="mbarrier.try_wait.parity.shared::cta.b64",
    doc="``mbarrier.try_wait.parity.shared::cta.b64``: (bar, parity) -> 1 once the phase "
    "with that parity has completed, else 0 after a hardware timeout; loop on it.",
)

def _spin_wait(name: str, semantics: str, doc: str):
    """A ``mbarrier.try_wait.parity{semantics}`` loop inside the asm: (bar, parity)."""
    instruction = f"mbarrier.try_wait.parity{semantics}.shared::cta.b64"
    return ptx_instruction(
        name,
        f"{{ .reg .pred p;\nwait:\n{instruction} p, [$0], $1;\n@!p bra wait;\n}}",
        inputs=(types.uint32, types.uint32),
        side_effect=True,
        memory=True,
        arch=SM90,
        instruction=instruction,
        doc=doc,
    )


mbarrier_wait = _spin_wait(
    "mbarrier_wait", "",
    "Spin on ``mbarrier.try_wait.parity`` until the phase of ``bar`` with parity "
    "``parity`` has completed: (bar, parity). The loop is inside the asm, so the compiler "
    "sees no divergent branch (ptxas serializes wgmma after branches it cannot prove "
    "warp-uniform).",
)

mbarrier_wait_cluster = _spin_wait(
    "mbarrier_wait_cluster", ".acquire.cluster",
    "(bar, parity): as ``mbarrier_wait``, with acquire semantics at cluster scope: for a "
    "phase completed by another CTA's ``st.async`` (``cluster.st_async_cluster_f32``).",
)
