"""The reliability table (tests/reliability_calls.py) on the CPU: it reaches every kernel
the package registers.

Each entry's inputs are built and its call planned as on a GPU of the given compute
capability and SM count, with the GPU taken away underneath: memory is addresses only,
host copies, memsets and tensor-map encodes do nothing, and a launch is noted instead of
run (kaionb.kernels.launch.KernelDef.__getitem__ hands out a recorder). What the host
paths choose is what they would choose on that GPU; nothing checks the results. The
module-level state the host paths keep (recorded calls, split-K workspaces, Hopper plans)
is swapped for empty copies and restored, so GPU tests later in the process never see
the fake addresses."""

import itertools
import sys

import numpy as np
import pytest

import reliability_calls as rc
from kaionb import _device, array
from kaionb import _tensor_map
from kaionb._device import STATE
from kaionb.kernels import launch
from kaionb.kernels import matmul as mm
from kaionb.kernels import matmul_int8 as mi8
from kaionb.kernels import op
from kaionb.testing import metadata_array

H100 = ((9, 0), 132)
A100 = ((8, 0), 108)


class _Recorder:
    """What KernelDef.__getitem__ returns here: notes each launch in ``launched``."""

    def __init__(self, kdef, which, launched):
        self.kdef, self._launched = kdef, launched
        self.signature = kdef.signatures[which] if isinstance(which, int) else which
        self._function = None  # (the occupancy queries get it, answered by a stub below)
        self.max_dynamic_shared = max(kdef.max_dynamic_shared_bytes,
                                      launch.DEFAULT_MAX_DYNAMIC_SHARED)

    def __call__(self, grid, block, args, **kwargs):
        self._launched.add((self.kdef.name, self.signature))

    def max_active_clusters(self, cluster, block, shared_mem):
        return 66


class _Buffer:
    """A fake allocation: an address in its own 4 GiB range, 256-byte aligned."""

    _next = itertools.count(1)

    def __init__(self):
        self.handle = 0x100000000 * next(self._next)


def _patch_everywhere(monkeypatch, name, fake):
    """Replace ``kaionb._device.<name>`` in every kaionb module that imported it."""
    real = getattr(_device, name)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("kaionb") and \
                getattr(module, name, None) is real:
            monkeypatch.setattr(module, name, fake)


@pytest.fixture
def dry_run(monkeypatch):
    """``dry_run(cc, sms)`` -> {entry: the (kernel, specialization) pairs it launches} for
    the entries that run on such a GPU."""
    from cuda.bindings import driver

    ok = driver.CUresult.CUDA_SUCCESS
    for name in ("cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async",
                 "cuMemsetD2D32Async", "cuMemcpyDtoDAsync", "cuStreamSynchronize"):
        monkeypatch.setattr(driver, name, lambda *args: (ok,))
    monkeypatch.setattr(driver, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                        lambda *args: (ok, 4))
    monkeypatch.setattr(array, "_allocate", lambda nbytes: (_Buffer(), 0))

    def from_host(obj, dtype):  # asarray of host data: the shape and dtype only
        host = np.asarray(obj, dtype=None if dtype is None else array.normalize_dtype(dtype))
        return array.empty(host.shape, host.dtype)

    monkeypatch.setattr(array, "_from_host", from_host)
    # an entry that checks its result reads back zeros
    monkeypatch.setattr(array.DeviceArray, "get",
                        lambda self, stream=None: np.zeros(self.shape, self.dtype))
    _patch_everywhere(monkeypatch, "current_allocator", lambda: (None, 0))
    _patch_everywhere(monkeypatch, "is_capturing", lambda handle: False)
    tensor_map = lambda storage, ld, box_rows: metadata_array((128,), np.uint8)  # noqa: E731
    for module in (_tensor_map, rc.mh):
        monkeypatch.setattr(module, "tensor_map_2d", tensor_map)
    for module, name in ((mm, "_HOPPER_PLANS"), (op, "_WORKSPACES"), (mi8, "_HOPPER_PLANS")):
        monkeypatch.setattr(module, name, {})
    saved = STATE.calls

    def run(cc, sms):
        monkeypatch.setattr(_device, "_compute_capability", lambda ordinal: cc)
        monkeypatch.setattr(_device, "_multiprocessor_count", lambda ordinal: sms)
        launched, per_entry = set(), {}
        monkeypatch.setattr(launch.KernelDef, "__getitem__",
                            lambda kdef, which: _Recorder(kdef, which, launched))
        for entry in rc.calls():
            if entry.runs_on(cc):
                launched.clear()
                rc.run_entry(entry)
                per_entry[entry.name] = set(launched)
        return per_entry

    yield run
    STATE.calls = saved


def _union(per_entry) -> set:
    return set().union(*per_entry.values())


def test_names_are_unique_and_shards_partition_the_table():
    table = rc.calls()
    names = [c.name for c in table]
    assert len(names) == len(set(names)) > 400
    shards = [c.name for i in range(8) for c in rc.shard(table, f"{i}/8")]
    assert sorted(shards) == sorted(names)


def test_every_registered_kernel_runs_on_an_h100(dry_run):
    per_entry = dry_run(*H100)
    cov = rc.coverage(_union(per_entry), H100[0])
    assert len(per_entry) == len(rc.calls())  # every entry runs there
    assert not cov.not_covered, cov.summary()
    assert not cov.cannot_run
    assert len(cov.covered) == len(rc.registered())


def test_variant_entries_launch_their_own_kernel(dry_run):
    """The entries made from a kernel table (matmul tiles, wgmma tiles, elementwise
    samples) each launch the kernel they are named after, not only some other entry."""
    per_entry = dry_run(*H100)
    expected = {}
    for operand, a_k, b_k, loads, tile in rc.mm._KERNELS:
        layout = rc._layout(a_k, b_k)
        if operand != "s8":
            expected[f"matmul/{operand}-{layout}-{loads}-{tile}"] = \
                f"_matmul_fwd_kernel_{operand}_{layout}_{loads}_{tile}"
    for operand, a_k, b_k, tile in rc.mh._KERNELS:
        layout = rc._layout(a_k, b_k)
        if operand != "s8":
            expected[f"matmul/wgmma-{operand}-{layout}-{tile}"] = \
                f"_matmul_wgmma_fwd_kernel_{operand}_{layout}_{tile}"
    for name in per_entry:
        if name.startswith("elementwise/"):
            expected[name] = "_elementwise_" + name.removeprefix("elementwise/") + "_kernel"
    assert len(expected) > 180
    wrong = {name: sorted(k for k, _ in per_entry[name]) for name, kernel in expected.items()
             if kernel not in {k for k, _ in per_entry[name]}}
    assert not wrong


def test_on_an_a100_only_hopper_kernels_are_left(dry_run):
    """Every kernel that can run on sm_80 is reached; the rest are sm_90a (wgmma) or
    cluster kernels, listed apart, and the entries skipped there are theirs."""
    per_entry = dry_run(*A100)
    cov = rc.coverage(_union(per_entry), A100[0])
    assert not cov.not_covered, cov.summary()
    assert cov.cannot_run and all(rc.registered()[k].min_cc == (9, 0) for k in cov.cannot_run)
    skipped = [c.name for c in rc.calls() if c.name not in per_entry]
    assert skipped and all("wgmma" in name or "cluster" in name for name in skipped)
