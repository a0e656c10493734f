"""DeviceArray on the GPU: allocation, transfers, copies and conversions, zero-copy exchange
with CuPy / PyTorch / numba, streams, the fast launch path, and errors that leave the CUDA
context usable."""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import kaionb
from kaionb.array import bfloat16
from kaionb.testing import assert_close, poisoned, random_array

pytestmark = pytest.mark.gpu

ALL_DTYPES = [np.float64, np.float32, np.float16, bfloat16, np.int64, np.int32, np.uint32,
              np.int16, np.uint16, np.int8, np.uint8, np.bool_]
FLOATS = [np.float32, np.float16, bfloat16, np.float64]


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (1,), (7, 33), (3, 5, 17)])
def test_round_trip_host(dtype, shape, rng):
    host = random_array(shape, dtype, rng=rng)
    dev = kaionb.asarray(host)
    assert dev.shape == host.shape and dev.dtype == host.dtype and dev.ptr != 0
    np.testing.assert_array_equal(dev.get(), host)


def test_creation_functions():
    assert (kaionb.zeros((5, 3), np.int32).get() == 0).all()
    full = kaionb.full((4, 9), 2.5, np.float16).get()
    assert full.dtype == np.float16 and (full == 2.5).all()
    f64 = kaionb.full((7,), -1.25, np.float64).get()
    assert (f64 == -1.25).all()
    e = kaionb.empty_like(kaionb.zeros((2, 2)), dtype=bfloat16)
    assert e.shape == (2, 2) and e.dtype == bfloat16
    assert kaionb.zeros_like(e).get().astype(np.float32).sum() == 0
    empty = kaionb.empty((0, 4))
    assert empty.size == 0 and empty.get().shape == (0, 4)


@pytest.mark.parametrize("src", FLOATS + [np.int8, np.uint8, np.int32],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dst", FLOATS, ids=lambda d: np.dtype(d).name)
def test_astype_matches_numpy_rounding(src, dst, rng):
    host = random_array((37, 129), src, rng=rng)
    if np.dtype(src).kind == "f" or np.dtype(src) == bfloat16:
        host = (host.astype(np.float64) * 300).astype(src)  # exercise half overflow → inf
    out = kaionb.asarray(host).astype(dst).get()
    # float64 → half goes through float32 (double rounding), like most GPU libraries.
    via = host.astype(np.float32) if np.dtype(src) == np.float64 and np.dtype(dst).itemsize == 2 \
        else host
    expect = via.astype(dst)
    np.testing.assert_array_equal(out.view(np.uint8), expect.view(np.uint8))


def test_strided_copy_transpose_and_fill(rng):
    host = random_array((6, 10, 12), np.float32, rng=rng)
    dev = kaionb.asarray(host)
    for view_np, view in [(host[:, ::3, 1:], dev[:, ::3, 1:]),
                          (host.transpose(2, 0, 1), dev.transpose(2, 0, 1)),
                          (host[::-1, 2], dev[::-1, 2])]:
        np.testing.assert_array_equal(view.get(), view_np)
        np.testing.assert_array_equal(view.copy().get(), view_np)
        np.testing.assert_array_equal(view.astype(np.float16).get(), view_np.astype(np.float16))
    r = dev.T.reshape(-1)  # not contiguous: a copy
    np.testing.assert_array_equal(r.get(), host.T.reshape(-1))
    target = kaionb.asarray(host.copy())
    target[:, 1::2, :5].fill(7.0)
    expect = host.copy()
    expect[:, 1::2, :5] = 7.0
    np.testing.assert_array_equal(target.get(), expect)


def test_poisoned_output_is_nan():
    p = poisoned((3, 4), np.float16).get()
    assert np.isnan(p).all()
    assert (poisoned((5,), np.int32).get() == np.iinfo(np.int32).max).all()


def test_memory_is_released():
    from cuda.bindings import driver

    kaionb.zeros((1,))
    kaionb.current_stream().synchronize()
    _, free_before, _ = driver.cuMemGetInfo()
    for _ in range(20):
        a = kaionb.empty((256, 1024, 1024), np.uint8)  # 256 MiB each
        del a
    kaionb.current_stream().synchronize()
    _, free_after, _ = driver.cuMemGetInfo()
    # 20 × 256 MiB were allocated; the pool may keep one, never all of them.
    assert free_before - free_after < 2 * 256 * 2**20


# -- zero-copy exchange --------------------------------------------------------------------

def test_cupy_zero_copy_both_ways(rng):
    cp = pytest.importorskip("cupy")
    host = random_array((33, 65), np.float32, rng=rng)
    side = cp.cuda.Stream(non_blocking=True)
    with side, kaionb.stream(side):
        _cupy_round_trips(cp, host)
    side.synchronize()


def _cupy_round_trips(cp, host):
    c = cp.asarray(host)
    k = kaionb.asarray(c)
    assert k.ptr == c.data.ptr
    np.testing.assert_array_equal(k.get(), host)
    back = cp.asarray(k)
    assert back.data.ptr == k.ptr
    k2 = kaionb.asarray(host[:, ::2].copy())
    c2 = cp.from_dlpack(k2)
    assert c2.data.ptr == k2.ptr
    np.testing.assert_array_equal(cp.asnumpy(c2), host[:, ::2])
    view = k[:, 1::2]  # strided export
    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(view)), host[:, 1::2])


@pytest.mark.parametrize("tdtype", ["float32", "float16", "bfloat16", "int8"])
def test_torch_zero_copy_on_a_side_stream(tdtype, rng):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, tdtype)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), kaionb.stream(side):
        t = torch.randn(17, 31, device="cuda").to(dt) if tdtype != "int8" else \
            torch.randint(-128, 127, (17, 31), device="cuda", dtype=dt)
        k = kaionb.from_dlpack(t)
        assert k.ptr == t.data_ptr() and k.shape == (17, 31)
        expect_dtype = {"bfloat16": bfloat16}.get(tdtype, np.dtype(tdtype))
        assert k.dtype == expect_dtype
        host = k.get()
        ref = t.float().cpu().numpy() if tdtype != "int8" else t.cpu().numpy()
        np.testing.assert_array_equal(host.astype(np.float32), ref.astype(np.float32))
        # back to torch, same memory, and a write through kaionb is seen by torch
        t2 = torch.from_dlpack(k)
        assert t2.data_ptr() == t.data_ptr() and t2.dtype == dt
        k.fill(3)
        torch.testing.assert_close(t.float(), torch.full_like(t.float(), 3.0))
    side.synchronize()


def test_torch_cpu_tensor_needs_copy():
    torch = pytest.importorskip("torch")
    cpu = torch.arange(6, dtype=torch.float32)
    with pytest.raises(ValueError, match="host memory"):
        kaionb.asarray(cpu)
    np.testing.assert_array_equal(kaionb.asarray(cpu, copy=True).get(), np.arange(6))
    with pytest.raises(ValueError, match="host memory"):
        kaionb.from_dlpack(cpu)


def test_numba_zero_copy(rng):
    from numba import cuda

    host = random_array((9, 40), np.float32, rng=rng)
    side = cuda.stream()
    with kaionb.stream(side):
        _numba_round_trips(cuda, host)
    side.synchronize()


def _numba_round_trips(cuda, host):
    k = kaionb.asarray(host)
    n = cuda.as_cuda_array(k)
    assert n.device_ctypes_pointer.value == k.ptr
    np.testing.assert_array_equal(n.copy_to_host(), host)
    back = kaionb.asarray(n)
    assert back.ptr == k.ptr
    bf = kaionb.asarray(host).astype(bfloat16)
    bits = cuda.as_cuda_array(bf.view(np.uint16))  # CAI has no bf16: exchange the bits
    np.testing.assert_array_equal(bits.copy_to_host(),
                                  host.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_kaionb_stream_orders_work():
    s = kaionb.Stream()
    host = np.arange(1 << 20, dtype=np.float32)
    with kaionb.stream(s):
        a = kaionb.asarray(host)
        b = a.astype(np.float16).astype(np.float32)
        out = b.get()
    s.synchronize()
    np.testing.assert_array_equal(out, host.astype(np.float16).astype(np.float32))


# -- the launch path ----------------------------------------------------------------------

def test_fast_launch_scalars_and_arrays(rng):
    from numba import cuda

    from kaionb.kernels.launch import KernelDef

    def _axpb_kernel(x, alpha, beta, n, out):
        i = cuda.grid(1)
        if i < n:
            out[i] = alpha * x[i] + beta

    kdef = KernelDef(_axpb_kernel, ["void(float32[::1], float32, float64, int32, float32[::1])"],
                     name="_test_axpb_kernel")
    host = random_array((1000,), np.float32, rng=rng)
    out = poisoned((1000,), np.float32)
    kdef[0]((4,), (256,), (kaionb.asarray(host), np.float32(1.5), -2.0, 999, out))
    got = out.get()
    assert_close(got[:999], 1.5 * host[:999].astype(np.float64) - 2.0)
    assert np.isnan(got[999])  # n = 999: the last element is never written


def test_kernel_cache_is_reused_by_a_second_process(tmp_path):
    script = (
        "import time, numpy as np, kaionb\n"
        "a = kaionb.asarray(np.arange(10, dtype=np.float32))\n"
        "t = time.perf_counter(); b = a.astype(np.float16); b.get()\n"
        "print(time.perf_counter() - t)\n")
    env = dict(os.environ, KAIONB_CACHE_DIR=str(tmp_path))
    cold = float(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                capture_output=True, text=True).stdout)
    assert [p for p in tmp_path.rglob("*") if p.is_file()], "nothing was cached"
    warm = float(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                capture_output=True, text=True).stdout)
    assert warm < cold / 2, (cold, warm)


def test_errors_leave_context_usable():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError):
        kaionb.empty((2, -1))
    with pytest.raises(TypeError):
        kaionb.asarray(np.array(["a", "b"]))
    with pytest.raises(TypeError):
        kaionb.asarray(np.ones(3, np.complex64))
    with pytest.raises(ValueError):
        kaionb.asarray(torch.ones(3)).reshape(4)
    with pytest.raises(IndexError):
        kaionb.zeros((3,))[5]
    a = kaionb.asarray(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal((a.astype(np.float16)).get(), np.arange(5, dtype=np.float16))
