"""Compile once, launch fast, and keep a registry of every kernel the package ships.

numba's dispatcher costs ~18 µs per launch with numba arrays and ~60 µs with CuPy arrays
(measured on an H100): it re-types the arguments on every call. A kaionb kernel is instead
declared with the exact signatures it will ever run with::

    @kernel(["void(float32[:, ::1], float32[::1], float32[:, ::1])"])
    def _scale_rows_fwd_kernel(x, w, out): ...

and launched through the specialization the host code picked::

    _scale_rows_fwd_kernel[0]((grid,), (256,), (x, w, out))

Each specialization is compiled to PTX by numba (``compile_ptx``, for the device's own
architecture, ``sm_90a`` where the kernel asks for it), assembled to a cubin by cuda.core
(by ptxas for sm_90a, see ``_assembler``), cached on disk, loaded with the driver, and
launched with ``cuLaunchKernel`` (``cuLaunchKernelEx`` for clusters) from a parameter
buffer packed by one ``struct.pack_into`` call — no per-call typing.

The registry (``all_kernels``) is what the CPU test walks to compile every specialization
of every kernel for sm_80, sm_89 and sm_90a and assemble it with ptxas.

Kernel *families* are the exception: the elementwise ops, reductions and gathers come in
one kernel per (op, dtypes, layout), thousands of combinations that a process makes on
first use (as CuPy does), from one factory each. Their kernels are built with
``registered=False``; the family registers a ``samples`` function instead (with
:func:`kernel_family`) that builds, through the same factory, a set covering every op,
every dtype and every layout at least once — what ``all_kernels`` hands the ptxas test.
"""

from __future__ import annotations

import ctypes
import importlib
import pkgutil
import struct
import threading

from .. import _kernel_cache as kernel_cache
from .._device import (
    STATE,
    check_driver,
    compute_capability,
    current_device,
    current_stream,
    shared_per_block_optin,
)
from .._toolchain import (
    CHECK_ARCHS,
    arch_name,
    assemble_cubin,
    assembler_version,
    compile_ptx,
    entry_name,
    find_ptxas,
)

# Every kernel the package defines, in definition order (the ptxas test walks this).
KERNELS: list["KernelDef"] = []
# Per kernel family, the function that builds its compile-checked samples (see module doc).
KERNEL_FAMILIES: list = []

# Above this, dynamic shared memory must be opted into per function (cuFuncSetAttribute).
DEFAULT_MAX_DYNAMIC_SHARED = 48 * 1024


class KernelDef:
    """A numba.cuda kernel function plus the specializations it is launched with."""

    def __init__(self, pyfunc, signatures, *, name=None, arch_specific=False, min_cc=(8, 0),
                 max_dynamic_shared_bytes=0, fastmath=False, lineinfo=False, launch_bounds=None,
                 registered=True, local_memory=None, non_portable_cluster=False,
                 address_scalars=False):
        if not signatures:
            raise ValueError(f"kernel {pyfunc.__name__}: at least one signature is required")
        self.pyfunc = pyfunc
        self.name = name or pyfunc.__name__
        self.signatures = [str(s) for s in signatures]
        self.arch_specific = arch_specific  # needs sm_90a (wgmma, setmaxnreg)
        self.min_cc = tuple(min_cc)
        self.max_dynamic_shared_bytes = max_dynamic_shared_bytes
        # Launched in clusters beyond the portable 8 CTAs (the H100 allows 16).
        self.non_portable_cluster = non_portable_cluster
        # Some scalar arguments are device addresses (tensor maps, workspaces), which a
        # replay recorded by kernels.op could not move to a new call's memory: its launches
        # are never replayed.
        self.address_scalars = address_scalars
        self.options = dict(fastmath=fastmath, lineinfo=lineinfo, launch_bounds=launch_bounds)
        # Why this kernel may have a stack frame (the ptxas test refuses one otherwise).
        self.local_memory = local_memory
        self._compiled: dict[tuple, CompiledKernel] = {}
        self._lock = threading.Lock()
        if registered:  # a family member made on first use is checked through its samples
            KERNELS.append(self)

    def check_archs(self) -> dict[tuple, str]:
        """The CHECK_ARCHS this kernel is meant to compile for."""
        return {cc: name for cc, name in CHECK_ARCHS.items()
                if cc[:2] >= self.min_cc and (len(cc) > 2 or not self.arch_specific)}

    def compile_ptx(self, signature: str, cc: tuple) -> str:
        """PTX for one specialization and architecture (no GPU needed)."""
        ptx, _ = compile_ptx(self.pyfunc, signature, cc, **self.options)
        return ptx

    def __getitem__(self, which) -> "CompiledKernel":
        """The specialization ``which`` (index or signature string), loaded on the current
        device."""
        signature = self.signatures[which] if isinstance(which, int) else str(which)
        if signature not in self.signatures:
            raise KeyError(f"kernel {self.name} has no specialization {signature!r}")
        # A module is loaded per device (its context); the cubin is shared per architecture.
        key = (signature, STATE.ordinal)
        compiled = self._compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(key)
                if compiled is None:
                    compiled = self._compiled[key] = self._build(signature,
                                                                 compute_capability())
        return compiled

    def _build(self, signature: str, device_cc: tuple) -> "CompiledKernel":
        if device_cc < self.min_cc:
            raise RuntimeError(f"kernel {self.name} needs compute capability "
                               f"{self.min_cc[0]}.{self.min_cc[1]}+, the GPU has "
                               f"{device_cc[0]}.{device_cc[1]}")
        cc = device_cc + ("a",) if self.arch_specific else device_cc
        arch = arch_name(cc)
        key = kernel_cache.kernel_key(self, signature, arch,
                                      f"cubin by {assembler_version(_assembler(arch))}")
        record = kernel_cache.load(key)
        if record is None:
            ptx = self.compile_ptx(signature, cc)
            record = [entry_name(ptx).encode(), _assemble_cubin(ptx, arch)]
            kernel_cache.store(key, record)
        entry, cubin = record
        return CompiledKernel(self, signature, entry.decode(), cubin)

    def __repr__(self) -> str:
        return f"<kaionb kernel {self.name}: {len(self.signatures)} specialization(s)>"


def kernel(signatures, **options):
    """Decorator: declare a kernel and the signatures it is launched with (see module doc)."""
    def wrap(pyfunc):
        return KernelDef(pyfunc, signatures, **options)
    return wrap


class CompiledKernel:
    """One specialization loaded on the device: ``ck(grid, block, args, stream=, shared_mem=)``.

    Arguments follow numba's kernel ABI: an array argument expands to (meminfo, parent,
    nitems, itemsize, data, shape..., strides...) — DeviceArray keeps that tuple ready in
    ``_numba_abi`` — and a scalar to one value. Each parameter gets an 8-byte slot in a
    per-thread buffer; the driver copies the parameters out at launch, so reuse is safe.
    """

    def __init__(self, kdef: KernelDef, signature: str, entry: str, cubin: bytes):
        from cuda.bindings import driver
        from numba.core import sigutils, types

        self.kdef = kdef
        self.signature = signature
        self._driver = driver
        current_device()
        err, self._module = driver.cuModuleLoadData(cubin)
        check_driver(err, f"loading kernel {kdef.name}")
        err, self._function = driver.cuModuleGetFunction(self._module, entry.encode())
        check_driver(err, f"cuModuleGetFunction({kdef.name})")
        attr = driver.CUfunction_attribute
        err, static = driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                                self._function)
        check_driver(err, f"reading {kdef.name}'s static shared memory")
        # The dynamic shared memory a launch may pass: what the kernel asks for, capped by
        # this device's opt-in limit (a kernel may ask for more than sm_89's 99 KiB and
        # size its launches by this).
        self.max_dynamic_shared = DEFAULT_MAX_DYNAMIC_SHARED - static
        if kdef.max_dynamic_shared_bytes > DEFAULT_MAX_DYNAMIC_SHARED:
            self.max_dynamic_shared = min(kdef.max_dynamic_shared_bytes,
                                          shared_per_block_optin() - static)
            (err,) = driver.cuFuncSetAttribute(
                self._function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.max_dynamic_shared)
            check_driver(err, f"raising {kdef.name}'s dynamic shared memory limit")
        if kdef.non_portable_cluster:
            (err,) = driver.cuFuncSetAttribute(
                self._function, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            check_driver(err, f"allowing {kdef.name} non-portable cluster sizes")

        argtypes, _ = sigutils.normalize_signature(signature)
        fmt, array_flags = "<", []
        for ty in argtypes:
            if isinstance(ty, types.Array):
                fmt += "q" * (5 + 2 * ty.ndim)
                array_flags.append(True)
            else:
                fmt += _scalar_format(ty, kdef.name)
                array_flags.append(False)
        self._packer = struct.Struct(fmt)
        self._nparams = self._packer.size // 8
        self._array_flags = tuple(array_flags)
        self._success = driver.CUresult.CUDA_SUCCESS
        self._local = threading.local()
        self._max_clusters: dict[tuple, int] = {}

    def _new_param_buffer(self):
        buf = ctypes.create_string_buffer(max(8, self._packer.size))
        base = ctypes.addressof(buf)
        ptrs = (ctypes.c_void_p * max(1, self._nparams))(
            *[base + 8 * i for i in range(self._nparams)])
        self._local.buf = (buf, ctypes.addressof(ptrs), ptrs)
        return self._local.buf

    def __call__(self, grid, block, args, *, stream=None, shared_mem=0, cluster=None):
        """Launch. ``cluster``: thread-block cluster dimensions (sm_90+; the grid must be a
        multiple of them), launched through ``cuLaunchKernelEx``."""
        flat = []
        for is_array, arg in zip(self._array_flags, args):
            if is_array:
                flat += arg._numba_abi
            else:
                flat.append(arg)
        try:
            buf, ptrs_addr, _ = self._local.buf
        except AttributeError:
            buf, ptrs_addr, _ = self._new_param_buffer()
        self._packer.pack_into(buf, 0, *flat)
        gx, gy, gz = _dim3(grid)
        bx, by, bz = _dim3(block)
        if STATE.recorder is not None:  # an op's first call: kernels.op replays it later
            STATE.recorder.launched(self, (gx, gy, gz), (bx, by, bz), args, flat, shared_mem,
                                    stream is None, cluster)
        if STATE.capture is not None:  # kaionb.graph(): the graph keeps the memory alive
            STATE.capture.keep(args)
        handle = current_stream().cu if stream is None else stream
        if cluster is None:
            (err,) = self._driver.cuLaunchKernel(self._function, gx, gy, gz, bx, by, bz,
                                                 shared_mem, handle, ptrs_addr, 0)
        else:
            config = self._cluster_config(cluster, (gx, gy, gz), (bx, by, bz), shared_mem)
            config.hStream = handle
            (err,) = self._driver.cuLaunchKernelEx(config, self._function, ptrs_addr, 0)
        if err != self._success:
            check_driver(err, f"launching {self.kdef.name} grid={grid} block={block}")

    def max_active_clusters(self, cluster, block, shared_mem) -> int:
        """How many clusters of this shape can be resident at once (persistent grids);
        asked of the driver once per (cluster, block, shared_mem)."""
        key = (cluster, block, shared_mem)
        cached = self._max_clusters.get(key)
        if cached is None:
            config = self._cluster_config(cluster, _dim3(cluster), _dim3(block), shared_mem)
            err, cached = self._driver.cuOccupancyMaxActiveClusters(self._function, config)
            check_driver(err, f"cuOccupancyMaxActiveClusters({self.kdef.name})")
            self._max_clusters[key] = cached
        return cached

    def _cluster_config(self, cluster, grid, block, shared_mem):
        """A per-thread CUlaunchConfig with the cluster-dimension attribute, built once per
        (cluster, grid, block, shared_mem): setting its fields costs more than a launch."""
        configs = getattr(self._local, "cluster_configs", None)
        if configs is None:
            configs = self._local.cluster_configs = {}
        key = (cluster, grid, block, shared_mem)
        config = configs.get(key)
        if config is None:
            driver = self._driver
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = (
                _dim3(cluster))
            config = configs[key] = driver.CUlaunchConfig()
            config.attrs = [attr]
            config.numAttrs = 1
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = shared_mem
        return config

    def __repr__(self) -> str:
        return f"<compiled {self.kdef.name} {self.signature}>"


def _dim3(d):
    if type(d) is tuple and len(d) == 3:
        return d
    if isinstance(d, int):
        return d, 1, 1
    n = len(d)
    return (d[0], d[1] if n > 1 else 1, d[2] if n > 2 else 1)


def _scalar_format(ty, kernel_name: str) -> str:
    from numba.core import types

    if isinstance(ty, types.Boolean):
        return "B7x"
    if isinstance(ty, types.Integer):
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[ty.bitwidth]
        code = code if ty.signed else code.upper()
        return code + "x" * (8 - ty.bitwidth // 8)
    if isinstance(ty, types.Float) and ty.bitwidth in (32, 64):
        return "f4x" if ty.bitwidth == 32 else "d"
    raise TypeError(f"kernel {kernel_name}: unsupported argument type {ty} for the fast launch path")


def kernel_family(samples):
    """Decorator for a kernel family's ``samples()`` -> list of KernelDefs, built by the
    family's factory (see the module doc); returns ``samples`` unchanged."""
    KERNEL_FAMILIES.append(samples)
    return samples


def all_kernels() -> list[KernelDef]:
    """Every kernel in the package, and each kernel family's samples: imports every module
    under kaionb.kernels first."""
    package = importlib.import_module("kaionb.kernels")
    for info in pkgutil.walk_packages(package.__path__, prefix="kaionb.kernels."):
        importlib.import_module(info.name)
    kernels = list(KERNELS)
    for samples in KERNEL_FAMILIES:
        kernels.extend(k for k in samples() if k not in kernels)
    return kernels


# -- PTX → cubin ----------------------------------------------------------------------------

def _assembler(arch: str) -> str:
    """Who turns PTX into a cubin: cuda.core's Program (nvJitLink), except that
    arch-specific (sm_90a) code goes through the ptxas binary where there is one — on the
    H100 machine nvJitLink serialized every wgmma of the Hopper matmul (a WARPGROUP.DEPBAR
    after each HGMMA, ~20% slower) where ptxas 12.9 and 13.0 pipeline them."""
    return "ptxas" if arch.endswith("a") and find_ptxas() else "nvjitlink"


def _assemble_cubin(ptx: str, arch: str) -> bytes:
    if _assembler(arch) == "ptxas":
        return assemble_cubin(ptx, arch)
    from cuda.core import Program, ProgramOptions

    return bytes(Program(ptx, "ptx", ProgramOptions(arch=arch)).compile("cubin").code)
