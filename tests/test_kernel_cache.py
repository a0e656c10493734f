"""The on-disk kernel cache (kaionb/_kernel_cache.py), ptxas discovery and the CPU showcase.

All on the CPU: a build is taken up to the cubin, and CompiledKernel (which loads it on a
GPU) is replaced by a stub that keeps what it was given.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from numba import cuda

import kaionb
from kaionb import _kernel_cache as kernel_cache
from kaionb import _toolchain, showcase
from kaionb.kernels import creation, launch

SIGNATURE = "void(float32[::1])"


def _double_kernel(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * 2.0


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KAIONB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KAIONB_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("KAIONB_CACHE_MAX_BYTES", raising=False)
    return tmp_path


@pytest.fixture
def compiles(monkeypatch):
    """Counts numba compilations made through the launcher; keeps the registry unchanged."""
    calls = []
    real = launch.compile_ptx

    def counting(pyfunc, signature, cc, **options):
        calls.append((pyfunc.__name__, signature, cc))
        return real(pyfunc, signature, cc, **options)

    monkeypatch.setattr(launch, "compile_ptx", counting)
    monkeypatch.setattr(launch, "KERNELS", list(launch.KERNELS))
    return calls


@pytest.fixture
def loaded(monkeypatch):
    """What each build would load on the device: (entry, cubin)."""
    got = []

    class LoadedStub:
        def __init__(self, kdef, signature, entry, cubin):
            got.append((entry, cubin))

    monkeypatch.setattr(launch, "CompiledKernel", LoadedStub)
    return got


def _build():
    """A fresh KernelDef (no in-memory specializations) built for sm_80."""
    kdef = launch.KernelDef(_double_kernel, [SIGNATURE], name="_test_double_kernel")
    return kdef._build(SIGNATURE, (8, 0))


def _entry_files(root):
    return [p for p in (root / "entries").rglob("*") if p.is_file()]


def test_cached_kernel_is_not_recompiled(cache_dir, compiles, loaded):
    _build()
    _build()
    assert len(compiles) == 1
    (entry, cubin), again = loaded
    assert again == (entry, cubin)
    assert entry.startswith("_Z") and cubin.startswith(b"\x7fELF")
    assert len(_entry_files(cache_dir)) == 1


def test_corrupted_entry_is_recompiled(cache_dir, compiles, loaded):
    _build()
    (path,) = _entry_files(cache_dir)
    good = path.read_bytes()
    path.write_bytes(good[:-100] + bytes(100))  # same size, last bytes zeroed
    _build()
    assert len(compiles) == 2
    assert loaded[1][1].startswith(b"\x7fELF")
    _build()  # the recompiled record replaced the corrupted one
    assert len(compiles) == 2
    assert loaded[2] == loaded[1]


@pytest.mark.parametrize("record", [b"", b"not a record", b"kaionb record 1\n" + bytes(40)])
def test_records_that_fail_the_check_are_misses(record):
    assert kernel_cache._unpack(record) is None


def test_record_round_trip():
    fields = [b"", b"_Zname", bytes(range(256)) * 3]
    assert kernel_cache._unpack(kernel_cache._pack(fields)) == fields


def test_disabled_cache_compiles_every_time(cache_dir, compiles, loaded, monkeypatch):
    monkeypatch.setenv("KAIONB_DISABLE_CACHE", "1")
    _build()
    _build()
    assert len(compiles) == 2
    assert not (cache_dir / "entries").exists()


def test_unusable_cache_directory_only_costs_recompiles(tmp_path, monkeypatch, compiles, loaded):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KAIONB_CACHE_DIR", str(blocker / "cache"))
    _build()
    _build()
    assert len(compiles) == 2


def test_size_bound_evicts_the_least_recently_read(cache_dir, monkeypatch):
    monkeypatch.setenv("KAIONB_CACHE_MAX_BYTES", "3500")
    payload = bytes(1000)
    for i in range(3):
        kernel_cache.store(f"key {i}", [payload])
        time.sleep(0.05)  # file times are jiffy-granular: keep the order unambiguous
    assert kernel_cache.load("key 0") == [payload]  # read: now the most recently used
    time.sleep(0.05)
    kernel_cache.store("key 3", [payload])
    assert kernel_cache.load("key 1") is None
    for i in (0, 2, 3):
        assert kernel_cache.load(f"key {i}") == [payload]
    total = sum(p.stat().st_size for p in _entry_files(cache_dir))
    assert total <= 3500


def test_bad_size_bound_is_reported(cache_dir, monkeypatch):
    monkeypatch.setenv("KAIONB_CACHE_MAX_BYTES", "2G")
    with pytest.raises(ValueError, match="KAIONB_CACHE_MAX_BYTES"):
        kernel_cache.program_cache()


def test_write_is_invisible_until_complete(cache_dir, monkeypatch):
    kernel_cache.store("key", [b"old"])
    real_replace = os.replace
    seen = []

    def replace(src, dst):
        # The new record is fully written to a temporary file; readers still see the old one.
        seen.append((open(src, "rb").read(), kernel_cache.load("key")))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    kernel_cache.store("key", [b"new"])
    assert seen == [(kernel_cache._pack([b"new"]), [b"old"])]
    assert kernel_cache.load("key") == [b"new"]


def test_failed_write_leaves_the_old_entry(cache_dir, monkeypatch):
    kernel_cache.store("key", [b"old"])

    def replace(src, dst):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", replace)
        kernel_cache.store("key", [b"new"])  # swallowed: costs a recompile, no more
    assert kernel_cache.load("key") == [b"old"]
    assert not [p for p in (cache_dir / "tmp").iterdir()]


def test_find_ptxas():
    _toolchain.find_ptxas.cache_clear()
    ptxas = _toolchain.find_ptxas()
    assert ptxas and os.access(ptxas, os.X_OK)
    proc = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True)
    assert "ptxas" in proc.stdout.lower() or "cuda" in proc.stdout.lower()


def test_find_ptxas_falls_back_to_path(monkeypatch, tmp_path):
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(_toolchain, "find_nvidia_binary_utility", lambda name: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    _toolchain.find_ptxas.cache_clear()
    try:
        assert _toolchain.find_ptxas() == str(fake)
    finally:
        _toolchain.find_ptxas.cache_clear()


_SECOND_PROCESS = """
from kaionb.kernels import creation, launch
calls = []
real = launch.compile_ptx
launch.compile_ptx = lambda *a, **k: calls.append(a) or real(*a, **k)
launch.CompiledKernel = lambda kdef, signature, entry, cubin: None
kdef = creation._RAMP_KERNELS[creation.np.dtype("float32")]
kdef._build(kdef.signatures[0], (8, 0))
print(len(calls))
"""


def test_a_second_process_does_not_compile(cache_dir):
    def compilations():
        proc = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], capture_output=True,
                              text=True, check=True, env=dict(os.environ))
        return int(proc.stdout.split()[-1])

    assert compilations() == 1
    assert compilations() == 0


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(kaionb, "gpu_available", lambda: False)


def test_showcase_prints_rows_and_reuses_the_cache(cache_dir, compiles, no_gpu, monkeypatch,
                                                   capsys):
    hopper_only = next(k for k in launch.all_kernels() if k.arch_specific)
    small = [creation._RAMP_KERNELS[np.dtype(np.float32)], hopper_only]  # the second has no sm_80 row
    monkeypatch.setattr(showcase, "all_kernels", lambda: small)

    assert showcase.main(["--arch", "sm_80"]) == 0
    first = capsys.readouterr().out
    assert len(compiles) == 1
    assert "_ramp_float32_kernel" in first and hopper_only.name not in first
    assert "1 compilations: about" in first  # the estimate comes before any row
    assert first.index("1 compilations: about") < first.index("_ramp_float32_kernel")
    assert "1 of 1 compilations assembled" in first

    assert showcase.main(["--arch", "sm_80"]) == 0
    second = capsys.readouterr().out
    assert len(compiles) == 1
    assert "ok (cached)" in second and "1 of 1 compilations assembled" in second


def test_showcase_fails_on_a_kernel_that_does_not_compile(cache_dir, compiles, no_gpu,
                                                          monkeypatch, capsys):
    broken = launch.KernelDef(_double_kernel, ["void(int32)"], name="_test_broken_kernel")
    monkeypatch.setattr(showcase, "all_kernels", lambda: [broken])
    assert showcase.main(["--arch", "sm_89"]) == 1
    out = capsys.readouterr().out
    assert "_test_broken_kernel" in out and "FAILED" in out
    assert "0 of 1 compilations assembled" in out


def test_showcase_arch_option(capsys):
    assert showcase._arch_list("sm_80, sm_90a") == ["sm_80", "sm_90a"]
    with pytest.raises(SystemExit):
        showcase.main(["--arch", "sm_70"])
    assert "expected sm_80, sm_89, sm_90a" in capsys.readouterr().err


@pytest.mark.gpu
def test_cached_cubin_loads_and_runs(cache_dir, compiles):
    for _ in range(2):  # the second KernelDef loads the cubin from the cache
        kdef = launch.KernelDef(_double_kernel, [SIGNATURE], name="_test_double_kernel")
        x = kaionb.asarray(np.arange(1000, dtype=np.float32))
        kdef[0]((4,), (256,), (x,))
        np.testing.assert_array_equal(x.get(), 2 * np.arange(1000, dtype=np.float32))
    assert len(compiles) == 1
