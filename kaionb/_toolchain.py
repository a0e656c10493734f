"""Offline compilation: numba → PTX for a named architecture, and ptxas to assemble it.

Works without a GPU: ``numba.cuda.compile_ptx`` needs only NVVM, and ptxas ships in the
``nvidia-cuda-nvcc-cu12`` wheel that numba-cuda's ``cu12`` extra installs. This is what lets
CI (no GPU) prove that every kernel the package ships compiles and assembles for each
architecture we support.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

from cuda.pathfinder import find_nvidia_binary_utility

# The architectures every shipped kernel is checked on: Ampere, Ada, Hopper (arch-specific,
# so that wgmma/setmaxnreg kernels assemble too). Keys are numba's ``cc`` tuples.
CHECK_ARCHS: dict[tuple, str] = {
    (8, 0): "sm_80",
    (8, 9): "sm_89",
    (9, 0, "a"): "sm_90a",
}

_ENTRY_RE = re.compile(r"^\.visible \.entry\s+([A-Za-z0-9_$]+)\(", re.MULTILINE)


def arch_name(cc: tuple) -> str:
    """``(9, 0, "a") -> "sm_90a"``, ``(8, 0) -> "sm_80"``."""
    return "sm_%d%d%s" % (cc[0], cc[1], cc[2] if len(cc) > 2 else "")


def entry_name(ptx: str) -> str:
    """The mangled name of the one kernel entry in a PTX module."""
    names = _ENTRY_RE.findall(ptx)
    if len(names) != 1:
        raise ValueError(f"expected exactly one .entry in the PTX module, found {len(names)}")
    return names[0]


_COMPILE_LOCK = threading.Lock()


@contextlib.contextmanager
def _device_functions_compile_for(cc):
    # numba-cuda 0.30 compiles a forceinline device function for get_current_device()'s cc,
    # even inside compile_ptx(cc=...): without a GPU that raises CudaSupportError, and with
    # one the arch gates in ptx_patches would check the wrong architecture. Point it at the
    # target for the duration of one compilation.
    import numba.cuda.dispatcher as dispatcher

    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def compile_ptx(pyfunc, signature, cc: tuple, **options):
    """``numba.cuda.compile_ptx(pyfunc, signature, cc=cc)`` that also works when the kernel
    calls device functions and no GPU is present (CI); returns ``(ptx, return_type)``.

    Serialized by a lock (it swaps a numba global; numba compiles under its own global lock
    anyway). numba caches a device function per argument types, so within one process the
    first compilation's architecture is the one its IR was typed for.
    """
    from numba import cuda

    with _COMPILE_LOCK, _device_functions_compile_for(cc):
        return cuda.compile_ptx(pyfunc, signature, cc=cc, **options)


@functools.lru_cache(maxsize=1)
def find_ptxas() -> str | None:
    """ptxas as cuda.pathfinder finds it (NVIDIA wheels, conda, $CUDA_PATH / $CUDA_HOME, the
    toolkit next to libcudart), then on PATH, which pathfinder does not search."""
    return find_nvidia_binary_utility("ptxas") or shutil.which("ptxas")


@functools.lru_cache(maxsize=None)
def assembler_version(assembler: str) -> str:
    """``"ptxas"`` or ``"nvjitlink"`` with its version, for cache keys: another version of
    the assembler makes other code (and another ``ptxas -v`` report)."""
    if assembler == "ptxas":
        proc = subprocess.run([find_ptxas(), "--version"], capture_output=True, text=True)
        return f"ptxas {proc.stdout.strip().splitlines()[-1]}"
    from cuda.bindings import nvjitlink

    try:
        return "nvJitLink %d.%d" % nvjitlink.version()
    except RuntimeError:  # no libnvJitLink: cuda.core links with the driver instead
        return "driver linker"


def assemble(ptx: str, arch: str, *, verbose: bool = True) -> str:
    """Assemble PTX with ptxas for ``arch`` (e.g. "sm_90a"); return ptxas's report.

    Raises RuntimeError with ptxas's message when assembly fails. ``verbose`` asks for the
    register / shared-memory / spill report (``ptxas -v``).
    """
    return _run_ptxas(ptx, arch, verbose)[0]


def assemble_cubin(ptx: str, arch: str) -> bytes:
    """The cubin ptxas makes of ``ptx`` for ``arch`` (RuntimeError as :func:`assemble`)."""
    return _run_ptxas(ptx, arch, False)[1]


def _run_ptxas(ptx: str, arch: str, verbose: bool) -> tuple[str, bytes]:
    ptxas = find_ptxas()
    if ptxas is None:
        raise RuntimeError("ptxas not found: install numba-cuda[cu12] (nvidia-cuda-nvcc-cu12)")
    with tempfile.TemporaryDirectory(prefix="kaionb-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        cmd = [ptxas, f"-arch={arch}", "-o", str(out), str(src)]
        if verbose:
            cmd.insert(1, "-v")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas -arch={arch} failed:\n{proc.stderr.strip()}")
        return proc.stderr, out.read_bytes()


_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")
_STACK_RE = re.compile(r"(\d+) bytes stack frame")


def parse_report(report: str) -> dict:
    """Registers, stack-frame and spill bytes from a ``ptxas -v`` report."""
    regs = _REGS_RE.search(report)
    spills = _SPILL_RE.search(report)
    stack = _STACK_RE.search(report)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "stack_frame": int(stack.group(1)) if stack else 0,
        "spill_stores": int(spills.group(1)) if spills else 0,
        "spill_loads": int(spills.group(2)) if spills else 0,
    }
