"""The small-allocation cache (kaionb._block_cache): the free lists on the CPU with
stand-in buffers; on a GPU, which allocations it serves, reuse of a dead array's memory,
results of ops whose outputs reuse memory, and empty_cache."""

import numpy as np
import pytest

import kaionb
from kaionb import _block_cache as bc
from kaionb.testing import random_array

gpu = pytest.mark.gpu


# A device no GPU has: a stand-in block that outlives the fixture (a failing test's
# traceback holds it) lands on a free list no real allocation reads.
D0, D1 = 1000, 1001


@pytest.fixture
def lists(monkeypatch):
    """Empty free lists for the test (the process's own are left as they were)."""
    free = {}
    monkeypatch.setattr(bc, "_FREE", free)
    return free


class _Buffer:
    """Stands in for a cuda.core Buffer: the cache only holds it."""

    def __init__(self, handle):
        self.handle = handle


class _Pool:
    """Stands in for the memory resource: notes the sizes it is asked for."""

    def __init__(self):
        self.sizes = []

    def allocate(self, size, stream=None):
        self.sizes.append(size)
        return _Buffer(0x1000 * len(self.sizes))


class _Stream:
    def as_core(self):
        return None


def test_sizes_round_up_to_a_power_of_two(lists):
    pool = _Pool()
    blocks = [bc.allocate(pool, D0, _Stream(), n) for n in (1, 255, 256, 257, 4096, 4097, 1 << 20)]
    assert pool.sizes == [b.size for b in blocks] == [256, 256, 256, 512, 4096, 8192, 1 << 20]


def test_a_dead_block_is_taken_again(lists):
    pool = _Pool()
    block = bc.allocate(pool, D0, _Stream(), 500)
    buffer, handle = block.buffer, block.handle
    assert block.size == 512 and handle == 0x1000 and bc.waiting_bytes(D0) == 0
    del block  # the last owner dies: on the list of its device and size
    assert bc.waiting_bytes(D0) == 512 and bc.waiting_bytes(D1) == 0
    again = bc.allocate(pool, D0, _Stream(), 300)  # same class: no new allocation
    assert again.buffer is buffer and again.handle == handle and pool.sizes == [512]
    other = bc.allocate(pool, D1, _Stream(), 300)  # another device: its own lists
    assert other.buffer is not buffer and pool.sizes == [512, 512]
    assert bc.allocate(pool, D0, _Stream(), 300).buffer is not buffer  # `again` lives


def test_free_lists_are_bounded_per_size(lists):
    size = bc.CLASS_BYTES // 4
    for i in range(6):
        bc.give_back(_Buffer(0x1000 * (i + 1)), 0x1000 * (i + 1), D0, size)
    assert len(lists[D0, size]) == 4 and bc.waiting_bytes(D0) == bc.CLASS_BYTES
    bc.give_back(_Buffer(0x9000), 0x9000, D0, 256)  # another size has its own bound
    assert bc.waiting_bytes(D0) == bc.CLASS_BYTES + 256


def test_empty_cache_drops_every_waiting_buffer(lists):
    for device in (D0, D1):
        for size in (256, 4096):
            bc.give_back(_Buffer(0x1000), 0x1000, device, size)
    kaionb.empty_cache()
    assert bc.waiting_bytes(D0) == bc.waiting_bytes(D1) == 0
    pool = _Pool()
    bc.allocate(pool, D0, _Stream(), 256)
    assert pool.sizes == [256]


def test_nothing_is_cached_with_per_thread_default_streams():
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    code = "from kaionb import _block_cache as bc; print(bc.CACHED_STREAM)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "None"
    assert bc.CACHED_STREAM == 0 or os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM")


# -- GPU -------------------------------------------------------------------------------------

@gpu
def test_small_arrays_on_the_default_stream_reuse_memory():
    kaionb.empty_cache()
    x = kaionb.empty(1000, np.float32)
    assert isinstance(x._owner, bc.Block) and x._owner.size == 4096
    ptr, device = x.ptr, x.device_id
    del x
    y = kaionb.empty((30, 30), np.float32)  # 3600 bytes: the same size class
    assert y.ptr == ptr
    z = kaionb.empty(1000, np.float32)  # y still lives: other memory
    assert z.ptr != ptr
    big = kaionb.empty((bc.SMALL_BYTES // 4) + 1, np.float32)
    assert not isinstance(big._owner, bc.Block)
    with kaionb.stream(kaionb.Stream()):
        other = kaionb.empty(1000, np.float32)
    assert not isinstance(other._owner, bc.Block)
    del y, z
    assert bc.waiting_bytes(device) >= 2 * 4096
    kaionb.empty_cache()
    assert bc.waiting_bytes(device) == 0


@gpu
def test_ops_whose_outputs_reuse_memory_compute_right():
    """Outputs made from the memory of the previous step's dead temporaries: every step
    checked against NumPy (a block handed out while still in use would show here)."""
    rng = np.random.default_rng(3)
    a_h = random_array((4, 4096), np.float32, rng=rng)
    b_h = random_array(4096, np.float32, rng=rng)
    a, b = kaionb.asarray(a_h), kaionb.asarray(b_h)
    x, x_h = a, a_h.astype(np.float64)
    kept = []
    for step in range(50):
        x = (x + b) * 0.5  # the temporary x + b dies at once; the next step reuses it
        x_h = (x_h + b_h) * 0.5
        if step % 10 == 0:
            kept.append((x, x_h.copy()))
    for got, want in kept + [(x, x_h)]:
        g = got.get().astype(np.float64)
        assert np.linalg.norm(g - want) / np.linalg.norm(want) < 1e-6
    ptrs = {got.ptr for got, _ in kept}
    assert len(ptrs) == len(kept)  # live arrays never share memory
