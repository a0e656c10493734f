"""Warp and block reductions: sum and max over float32 values, and factories for any
associative merge over (value, index) pairs of any numeric type.

Warp level: a butterfly of ``shfl.xor`` (numba's ``cuda.shfl_xor_sync``): after the five
steps (offsets 16, 8, 4, 2, 1) every lane holds the result, so no broadcast is needed.
Block level: each warp reduces, lane 0 of each warp writes its partial to a shared
``scratch`` array (float32, at least 32 elements, supplied by the caller so one buffer can
serve several reductions), warp 0 reduces the partials, and the result is broadcast
through ``scratch[0]``. Every thread of the block must call a block reduction, and the
block size must be a multiple of 32 (a partial warp would make the full-mask shuffle
undefined). The trailing barrier lets the caller reuse ``scratch`` at once.

The pair factories (:func:`warp_pair_reducer`, :func:`block_pair_reducer`) serve the
reductions of kernels/reductions.py: ``merge(v, i, w, j) -> (v, i)`` combines two values
with their indices (argmax keeps the index of the winner). With ``indexed=False`` (sum,
max, ...) the index is not exchanged — a shuffle is never dropped as dead code, even when
its result goes unused. The reduction can run over *groups* of lanes: with ``lowest = g``
the butterfly stops at offset g, so lanes that differ below g (a column tile of g threads
per warp row) keep separate results.

Cluster level (sm_90, :func:`cluster_reducers`): each CTA reduces its block, thread 0
parks the result in a shared ``slots[k]``, a cluster barrier publishes it, and thread 0
reads all CTAs' slots through distributed shared memory, combines them in rank order —
the same order in every CTA, so all get the same bits — and hands the result to the
block through ``scratch``. :func:`cluster_sums` does
that for several sums with one barrier, and alternates slots so a kernel can reduce row
after row.

Plain numba, but the CUDA simulator has no warp shuffles: under
``NUMBA_ENABLE_CUDASIM=1`` they raise AttributeError (``shfl_xor_sync``).
"""

import functools

from numba import cuda, float32, int32, int64, types, uint32

from kaionb.ptx_patches import (
    cluster_arrive,
    cluster_wait,
    device_function,
    ld_shared_cluster_f32,
    shared_addr,
)

FULL_MASK = 0xFFFFFFFF


@device_function
def warp_sum(x):
    """Sum of ``x`` over the 32 lanes of the warp, returned to every lane."""
    for offset in (16, 8, 4, 2, 1):
        x += cuda.shfl_xor_sync(FULL_MASK, x, offset)
    return x


@device_function
def warp_max(x):
    """Maximum of ``x`` over the 32 lanes of the warp, returned to every lane."""
    for offset in (16, 8, 4, 2, 1):
        x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, offset))
    return x


@device_function
def block_sum(x, scratch):
    """Sum of ``x`` over the (1-D) block, returned to every thread.

    ``scratch``: shared float32 array of >= 32 elements. blockDim.x % 32 == 0.
    """
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    nwarps = cuda.blockDim.x // 32
    x = warp_sum(x)
    if lane == 0:
        scratch[warp] = x
    cuda.syncthreads()
    if warp == 0:
        # Lanes past the last warp contribute the sum's identity.
        v = scratch[lane] if lane < nwarps else float32(0.0)
        v = warp_sum(v)
        if lane == 0:
            scratch[0] = v
    cuda.syncthreads()
    total = scratch[0]
    cuda.syncthreads()
    return total


@device_function
def block_max(x, scratch):
    """Maximum of ``x`` over the (1-D) block, returned to every thread.

    ``scratch``: shared float32 array of >= 32 elements. blockDim.x % 32 == 0.
    """
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    nwarps = cuda.blockDim.x // 32
    x = warp_max(x)
    if lane == 0:
        scratch[warp] = x
    cuda.syncthreads()
    if warp == 0:
        # max is idempotent: lanes past the last warp repeat warp 0's partial.
        v = scratch[lane] if lane < nwarps else scratch[0]
        v = warp_max(v)
        # The shuffles already order the lanes' reads of scratch[0] before lane 0's
        # write; compute-sanitizer's racecheck does not count them as a barrier (a warning
        # per block), a warp barrier it does.
        cuda.syncwarp()
        if lane == 0:
            scratch[0] = v
    cuda.syncthreads()
    result = scratch[0]
    cuda.syncthreads()
    return result


@functools.cache
def block_sums(count):
    """Device function ``(values, scratch)``: the block sums of ``count`` float32 values at
    once, in place — ``values`` a local array of ``count`` elements per thread, each
    replaced by its sum over the (1-D) block. One barrier round for all of them where
    separate :func:`block_sum` calls take one each (the norms' backward reduces two to
    four row sums per row). ``scratch``: shared float32, at least 32 × ``count`` elements;
    the rules of :func:`block_sum` (every thread calls it, blockDim.x % 32 == 0)."""

    @device_function
    def block_sums_n(values, scratch):
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        nwarps = cuda.blockDim.x // 32
        for k in range(count):
            values[k] = warp_sum(values[k])
        if lane == 0:
            for k in range(count):
                scratch[32 * k + warp] = values[k]
        cuda.syncthreads()
        if warp == 0:
            for k in range(count):
                v = warp_sum(scratch[32 * k + lane] if lane < nwarps else float32(0.0))
                if lane == 0:
                    scratch[32 * k] = v
        cuda.syncthreads()
        for k in range(count):
            values[k] = scratch[32 * k]
        cuda.syncthreads()

    return block_sums_n


def _shuffle_type(value_type):
    """The type a ``value_type`` value crosses ``shfl.sync`` as: numba shuffles only 32-
    and 64-bit ints and floats; narrower ints widen to int32 and come back truncated,
    unsigned ints travel as the signed int of their width (the bits are unchanged)."""
    if isinstance(value_type, types.Float):
        return value_type
    return int64 if value_type.bitwidth == 64 else int32


@functools.cache
def warp_pair_reducer(merge, value_type, indexed=True):
    """Device function ``(v, i, lowest) -> (v, i)``: ``merge`` of the (value, index) pairs
    of the lanes that differ only in the bits of ``lowest`` and above (``lowest`` a power
    of two <= 16: 1 merges the whole warp, g keeps g separate results in lanes that differ
    below g). Every lane gets its group's result. ``merge`` must be associative and
    commutative (a butterfly pairs lanes in no fixed order); ``value_type`` is v's numba
    type, i is int64. ``indexed=False``: only values travel (``merge`` ignores j)."""
    carrier = _shuffle_type(value_type)

    @device_function
    def warp_reduce_pairs(v, i, lowest):
        offset = 16
        while offset >= lowest:
            w = value_type(cuda.shfl_xor_sync(FULL_MASK, carrier(v), offset))
            j = cuda.shfl_xor_sync(FULL_MASK, i, offset) if indexed else i
            v, i = merge(v, i, w, j)
            offset >>= 1
        return v, i

    return warp_reduce_pairs


@functools.cache
def block_pair_reducer(merge, value_type, indexed=True):
    """Device function ``(v, i, group, sv, si) -> (v, i)``: ``merge`` over the threads of
    the block whose linear thread index (x fastest) is congruent modulo ``group`` (a power
    of two <= 32; 1: the whole block). The result is valid in the threads with linear index
    < group, the group's first threads. ``sv`` / ``si``: shared arrays (value_type, int64)
    of at least ``group`` x (warps in the block) elements. Every thread of the block must
    call it; block size a multiple of 32. ``indexed``: as for :func:`warp_pair_reducer`."""
    warp_reduce_pairs = warp_pair_reducer(merge, value_type, indexed)

    @device_function
    def block_reduce_pairs(v, i, group, sv, si):
        lin = int32(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x)
        lane = lin % 32
        warp = lin // 32
        warps = int32(cuda.blockDim.x * cuda.blockDim.y) // 32
        v, i = warp_reduce_pairs(v, i, group)
        if lane < group:
            sv[warp * group + lane] = v
            if indexed:
                si[warp * group + lane] = i
        cuda.syncthreads()
        if lin < group:  # warp 0's lanes already hold its part
            for w in range(1, warps):
                j = si[w * group + lin] if indexed else i
                v, i = merge(v, i, sv[w * group + lin], j)
        cuda.syncthreads()
        return v, i

    return block_reduce_pairs


@functools.cache
def cluster_reducers(size):
    """``(cluster_sum, cluster_max)`` for thread-block clusters of ``size`` CTAs (sm_90):
    ``(x, scratch, slots, k) -> float32`` reduces ``x`` over every thread of every CTA of
    the cluster and returns the result to all. ``scratch`` as for :func:`block_sum`;
    ``slots``: a shared float32 array, one element per reduction the kernel makes
    (``k``-th reduction uses ``slots[k]``, so a slot is never rewritten while another CTA
    may still read it). Every thread of every CTA must call it. The kernel must end with
    ``cluster_arrive(); cluster_wait()`` (a CTA's slots must outlive the others' reads);
    the arrive may come as soon as its last cluster reduction has returned (then the
    others' exit barrier is not on its way: the forward row kernels do that)."""

    @device_function
    def cluster_sum(x, scratch, slots, k):
        part = block_sum(x, scratch)
        _publish(part, slots, k)
        if cuda.threadIdx.x == 0:
            addr = shared_addr(slots, k)
            total = ld_shared_cluster_f32(addr, uint32(0))
            for rank in range(1, size):
                total += ld_shared_cluster_f32(addr, uint32(rank))
            scratch[0] = total
        return _broadcast(scratch)

    @device_function
    def cluster_max(x, scratch, slots, k):
        part = block_max(x, scratch)
        _publish(part, slots, k)
        if cuda.threadIdx.x == 0:
            addr = shared_addr(slots, k)
            total = ld_shared_cluster_f32(addr, uint32(0))
            for rank in range(1, size):
                total = max(total, ld_shared_cluster_f32(addr, uint32(rank)))
            scratch[0] = total
        return _broadcast(scratch)

    return cluster_sum, cluster_max


@functools.cache
def row_reducers(size):
    """``(row_sum, row_max)`` with the signature of :func:`cluster_reducers`'s, for a row
    held by one CTA (``size`` 1: :func:`block_sum` / :func:`block_max`, ``slots`` and
    ``k`` unused) or by the ``size`` CTAs of a cluster — so one row kernel factory makes
    both variants."""
    if size > 1:
        return cluster_reducers(size)

    @device_function
    def row_sum(x, scratch, slots, k):
        return block_sum(x, scratch)

    @device_function
    def row_max(x, scratch, slots, k):
        return block_max(x, scratch)

    return row_sum, row_max


@device_function
def _publish(part, slots, k):
    """Thread 0 parks the block's ``part`` in ``slots[k]`` for the cluster; one cluster
    barrier (a release arrive: a relaxed one after thread 0's fence.acq_rel.cluster took
    per-row quantize at [2048, 65536] from 85% to 70% of copy on the H100)."""
    if cuda.threadIdx.x == 0:
        slots[k] = part
    cluster_arrive()
    cluster_wait()


@device_function
def _broadcast(scratch):
    """scratch[0], written by thread 0, to every thread of the block (the block reductions
    end with a barrier, so scratch is free when thread 0 writes it). One thread reads the
    other CTAs' slots: every thread reading them through distributed shared memory cost
    ~3 µs a reduction with 1024-thread CTAs (the norms' backward on the H100)."""
    cuda.syncthreads()
    value = scratch[0]
    cuda.syncthreads()
    return value


@functools.cache
def cluster_sums(count, size):
    """Device function ``(values, scratch, slots, at)``: :func:`block_sums` of ``count``
    values in place, then (``size`` > 1, sm_90) their sums over the ``size`` CTAs of the
    cluster — thread 0 parks the block's sums in ``slots[at:at + count]`` (shared
    float32), one cluster barrier, thread k < count adds sum k's slots over the CTAs in
    rank order (the same bits in every CTA) and shares it through ``scratch``.
    Consecutive reductions must alternate between two sets of slots: a CTA writes
    reduction j + 2's slots only after the barrier of j + 1, which no CTA passes before it
    has read j's. With ``size`` = 1 it is block_sums (``slots`` and ``at`` unused). The
    kernel ends as for :func:`cluster_reducers`."""
    block = block_sums(count)
    CLUSTER = size

    park, take = _slot_exchange(count)

    @device_function
    def cluster_sums_n(values, scratch, slots, at):
        block(values, scratch)
        if CLUSTER > 1:
            park(values, slots, at)
            t = cuda.threadIdx.x
            if t < count:
                addr = shared_addr(slots, at + t)
                total = ld_shared_cluster_f32(addr, uint32(0))
                for rank in range(1, CLUSTER):
                    total += ld_shared_cluster_f32(addr, uint32(rank))
                scratch[t] = total
            take(values, scratch)

    return cluster_sums_n


@functools.cache
def _slot_exchange(count):
    """``(park, take)`` device functions of the cluster reductions over ``count`` values:
    ``park(values, slots, at)`` — thread 0 writes the CTA's values to its
    ``slots[at:at + count]``, then one cluster barrier (every CTA's slots written);
    ``take(values, scratch)`` — every thread reads the combined values from
    ``scratch[0:count]`` (written by the reading threads), between block barriers."""

    @device_function
    def park(values, slots, at):
        if cuda.threadIdx.x == 0:
            for k in range(count):
                slots[at + k] = values[k]
        cluster_arrive()
        cluster_wait()

    @device_function
    def take(values, scratch):
        cuda.syncthreads()
        for k in range(count):
            values[k] = scratch[k]
        cuda.syncthreads()

    return park, take


@functools.cache
def cluster_fold(count, size, merge):
    """Device function ``(values, scratch, slots, at)``: fold ``count`` per-CTA values
    (each already reduced over its CTA, the same in all its threads) over the ``size``
    CTAs of a cluster with ``merge(acc, other)`` — a device function that folds the local
    float32 array ``other`` into ``acc`` in place (both ``count`` long), for statistics
    that are not plain sums (softmax's (maximum, sum of exponentials)). Thread 0 parks
    the values in ``slots[at:at + count]``, one cluster barrier, thread 0 reads every
    CTA's in rank order (the same bits in every CTA) and shares the result through
    ``scratch`` (at least ``count`` floats). Slots alternate and the kernel ends as for
    :func:`cluster_sums`."""

    park, take = _slot_exchange(count)

    @device_function
    def cluster_fold_n(values, scratch, slots, at):
        park(values, slots, at)
        if cuda.threadIdx.x == 0:
            acc = cuda.local.array(count, float32)
            other = cuda.local.array(count, float32)
            for k in range(count):
                acc[k] = ld_shared_cluster_f32(shared_addr(slots, at + k), uint32(0))
            for rank in range(1, size):
                for k in range(count):
                    other[k] = ld_shared_cluster_f32(shared_addr(slots, at + k), uint32(rank))
                merge(acc, other)
            for k in range(count):
                scratch[k] = acc[k]
        take(values, scratch)

    return cluster_fold_n


@functools.cache
def block_column_reducer(merge, cols):
    """Device function ``(a, group, scratch)`` for column kernels: block (group, ty)
    threads, thread x owning ``cols`` columns and the y threads splitting the reduced axis.
    For each k < cols it merges the float32 ``a[k]`` (a local array) of the threads whose
    linear index is congruent modulo ``group`` (= blockDim.x, a power of two up to the
    block size) and hands every thread its group's result back in ``a[k]`` — one set of
    barriers for all the columns.

    Steps: a butterfly over the lanes of each warp that share x (offsets 16 .. group, none
    when group >= 32); one partial per (warp or y row, column) to shared memory; the
    threads with linear index < group·cols (in turn) merge one column's partials each;
    everyone reads its columns back. ``merge(v, w)``: associative and commutative (max,
    sum). ``scratch``: shared float32 of at least cols × block size elements. Every thread
    of the block calls it; the block size is a multiple of 32."""

    @device_function
    def block_reduce_columns(a, group, scratch):
        lin = int32(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x)
        threads = int32(cuda.blockDim.x * cuda.blockDim.y)
        lane = lin % 32
        offset = 16
        while offset >= group:  # lanes of one warp that differ above x's bits
            for k in range(cols):
                a[k] = merge(a[k], cuda.shfl_xor_sync(FULL_MASK, a[k], offset))
            offset >>= 1
        # One partial per row of the block's partials: warps (group < 32) or y threads.
        span = max(int32(32), group)
        rows = threads // span
        if lane < group:
            at = ((lin // span) * group + lin % group) * cols
            for k in range(cols):
                scratch[at + k] = a[k]
        cuda.syncthreads()
        width = group * cols
        for idx in range(lin, width, threads):  # slot idx of row 0: only this thread's
            v = scratch[idx]
            for row in range(1, rows):
                v = merge(v, scratch[row * width + idx])
            scratch[idx] = v
        cuda.syncthreads()
        at = (lin % group) * cols
        for k in range(cols):
            a[k] = scratch[at + k]
        cuda.syncthreads()

    return block_reduce_columns
