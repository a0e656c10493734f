"""Every kernel the package ships, every specialization, compiled by numba for sm_80, sm_89
and sm_90a and assembled by ptxas — on any machine, GPU or not. The list comes from the
kernel registry, so a new kernel is covered the moment it is defined."""

from collections import Counter

import pytest

from kaionb._toolchain import CHECK_ARCHS, assemble, entry_name, parse_report
from kaionb.kernels.launch import all_kernels


def _package_kernels():
    """The package's own kernels in the registry. The registry is one global list that
    tests may add to (tests/test_array_gpu.py defines a KernelDef while it runs on a GPU),
    so both the cases and the checks below use one snapshot of it, filtered to kaionb."""
    return [k for k in all_kernels() if k.pyfunc.__module__.startswith("kaionb.")]


KERNELS = _package_kernels()

CASES = [
    pytest.param(k, sig, cc, arch, id=f"{k.name}-{arch}-{i}")
    for k in KERNELS
    for i, sig in enumerate(k.signatures)
    for cc, arch in k.check_archs().items()
]

ALL_ARCHS = set(CHECK_ARCHS.values())
ARCH_SPECIFIC = {arch for cc, arch in CHECK_ARCHS.items() if len(cc) > 2}  # {"sm_90a"}


def test_registry_is_populated():
    names = [k.name for k in KERNELS]
    assert len(set(names)) == len(names), [n for n, c in Counter(names).items() if c > 1]
    # all_kernels() imported the op modules (kernel names are the modules' business), and
    # there are matmul kernels for sm_80+ (mma.sync) and for sm_90a only (wgmma).
    modules = {k.pyfunc.__module__ for k in KERNELS}
    assert {"kaionb.kernels.elementwise", "kaionb.kernels.matmul"} <= modules, modules
    assert any("matmul" in k.name and not k.arch_specific for k in KERNELS)
    assert any("matmul" in k.name and k.arch_specific for k in KERNELS)
    # The package defines its kernels at import: any it made later (by the time this test
    # runs, other tests have called into it) would have escaped the compile check.
    late = {k.name for k in _package_kernels()} - set(names)
    assert not late, f"kernels registered after import, not compile-checked: {sorted(late)}"

    archs_of = {}
    for case in CASES:
        kdef, _, _, arch = case.values
        archs_of.setdefault(kdef.name, Counter())[arch] += 1
    for k in KERNELS:
        archs = archs_of.get(k.name, Counter())
        # Each signature once per architecture the kernel is meant for, and no kernel
        # without a single checked architecture.
        assert archs and all(c == len(k.signatures) for c in archs.values()), (k, archs)
        assert set(archs) == set(k.check_archs().values()), (k, archs)
        if k.arch_specific:
            assert set(archs) == ARCH_SPECIFIC, (k, archs)
        elif k.min_cc <= (8, 0):
            assert set(archs) == ALL_ARCHS, (k, archs)


@pytest.mark.parametrize("kdef, signature, cc, arch", CASES)
def test_kernel_compiles_and_assembles(kdef, signature, cc, arch):
    ptx = kdef.compile_ptx(signature, cc)
    assert f".target {arch}" in ptx
    entry_name(ptx)  # exactly one kernel entry
    report = parse_report(assemble(ptx, arch))
    assert report["registers"] is not None, report
    # Local memory (spills, or a local array the compiler could not keep in registers) is a
    # performance bug in every kernel we ship.
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0, report
    # (A kernel that names its reason — libdevice's sin/cos keep a table for huge
    # arguments there — may have a stack frame, but never spills.)
    assert report["stack_frame"] == 0 or kdef.local_memory, report
