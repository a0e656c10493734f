"""Every kernel the package ships, every specialization, compiled by numba for sm_80, sm_89
and sm_90a and assembled by ptxas — on any machine, GPU or not. The list comes from the
kernel registry, so a new kernel is covered the moment it is defined."""

import pytest

from kaionb._toolchain import assemble, entry_name, parse_report
from kaionb.kernels.launch import all_kernels

CASES = [
    pytest.param(k, sig, cc, arch, id=f"{k.name}-{arch}-{i}")
    for k in all_kernels()
    for i, sig in enumerate(k.signatures)
    for cc, arch in k.check_archs().items()
]


def test_registry_is_populated():
    names = {k.name for k in all_kernels()}
    assert "_convert_float32_to_float16_kernel" in names
    assert len(CASES) >= 3 * len(names) - 2 * sum(k.arch_specific for k in all_kernels())


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
    assert report["stack_frame"] == 0, report
