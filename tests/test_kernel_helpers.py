"""kaionb.kernels.helpers: maps are consistent, helpers compile for every arch, and on a
GPU each helper matches a NumPy model (outputs poisoned first)."""

import importlib.util
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32, types, uint16

import kaionb.kernels.helpers as H
from kaionb._toolchain import CHECK_ARCHS, assemble
import kaionb.ptx_patches as P
from kaionb._toolchain import compile_ptx as compile_ptx_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(7)
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not cuda.is_available(), reason="no CUDA GPU")


def _load_example():
    path = os.path.join(REPO, "examples", "writing_kernels_matmul.py")
    spec = importlib.util.spec_from_file_location("writing_kernels_matmul", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    "fn,count,shape",
    [
        (H.frag_a_m16n8k16, 8, (16, 16)),
        (H.frag_b_m16n8k16, 4, (16, 8)),
        (H.frag_c_m16n8, 4, (16, 8)),
        (H.frag_a_m16n8k32_s8, 16, (16, 32)),
        (H.frag_b_m16n8k32_s8, 8, (32, 8)),
        (H.frag_a_m16n8k8_tf32, 4, (16, 8)),
        (H.frag_b_m16n8k8_tf32, 2, (8, 8)),
    ],
)
def test_fragment_map_covers_each_element_once(fn, count, shape):
    hits = np.zeros(shape, int)
    for lane in range(32):
        for i in range(count):
            hits[fn.py_func(lane, i)] += 1
    assert (hits == 1).all()


def test_ldmatrix_lane_addresses():
    rows = {H.ldmatrix_x4_row_col.py_func(lane) for lane in range(32)}
    assert rows == {(r, c) for r in range(16) for c in (0, 8)}
    b_rows = {H.ldmatrix_x4_b_row_col.py_func(lane) for lane in range(32)}
    assert b_rows == {(n, k) for n in range(16) for k in (0, 8)}


@pytest.mark.parametrize("cols", [32, 64, 128])
def test_swizzle_is_a_bijection_that_keeps_16_byte_chunks(cols):
    rows = 64
    swz = H.swizzle_128b.py_func
    idx = np.array([[swz((r * cols + c) * 2) >> 1 for c in range(cols)] for r in range(rows)])
    assert sorted(idx.ravel()) == list(range(rows * cols))
    # 8 consecutive elements (one cp.async / ldmatrix row) stay contiguous and in order.
    chunks = idx.reshape(rows, cols // 8, 8)
    assert (np.diff(chunks, axis=2) == 1).all() and (chunks[..., 0] % 8 == 0).all()


def _helpers_kernel(u, f, h, h2, c16, c32):
    scratch = cuda.shared.array(32, float32)
    tile = cuda.shared.array(2048, uint16)
    tid = cuda.threadIdx.x
    x = f[tid]
    f[tid] = H.warp_sum(x) + H.warp_max(x) + H.block_sum(x, scratch) + H.block_max(x, scratch)
    H.cp_async_tile_16b(tile, h2, 3, 8, 32, 64, tid, 128)
    v = H.load_f32x4(f, 0)
    w = H.load_f32x4_readonly(f, 4)
    H.store_f32x4(f, 8, (v[0], w[1], v[2], w[3]))
    H.store_f32x4_masked(f, 12, f.shape[0], H.load_f32x4_masked(f, 16, f.shape[0], 0.0))
    H.store_u32x4(u, 0, H.load_u32x4(u, 4))
    q = H.load_u32x4_readonly(u, 8)
    u[tid] = q[0] + tile[tid]
    d = (x, x, x, x)
    H.store_c_frag_f16(c16, 0, 0, tid % 32, d)
    H.store_c_frag_bf16(c16, 16, 0, tid % 32, d)
    H.store_c_frag_f32(c32, 0, 0, tid % 32, d)


def test_mma_pipeline_geometry():
    """16-row warp tiles (MT = 1, a 1×4 warp grid) build where A is K-major; tiles the
    loaders, the warp grid or the k-step swizzle cannot serve are refused at build time."""
    from kaionb.kernels.helpers.mma_pipeline import mma_pipeline

    pipe = mma_pipeline("f16", True, False, "async", (16, 64, 64, 1, 4, 4))
    assert (pipe.THREADS, pipe.MT, pipe.NT) == (128, 1, 2)
    assert pipe.SHARED_BYTES == 4 * (16 * 64 + 64 * 64) * 2
    mma_pipeline("bf16", True, True, "async", (16, 64, 64, 1, 4, 4))
    mma_pipeline("f16", False, False, "async", (32, 64, 64, 1, 4, 4))  # 64-byte A rows
    with pytest.raises(ValueError, match="too narrow for an M/N-major f16 operand"):
        mma_pipeline("f16", False, False, "async", (16, 64, 64, 1, 4, 4))  # 32-byte rows
    with pytest.raises(ValueError, match="does not fit the loaders"):
        # 128 chunks of A per stage for 256 threads
        mma_pipeline("f16", True, False, "async", (16, 128, 64, 1, 8, 4))
    with pytest.raises(ValueError, match="m16 x n16 warp tiles"):
        mma_pipeline("f16", True, False, "async", (16, 64, 64, 2, 2, 4))  # 8-row warp tiles


@pytest.mark.parametrize("cc", list(CHECK_ARCHS), ids=list(CHECK_ARCHS.values()))
def test_helpers_compile_and_assemble(cc):
    sig = (types.uint32[::1], types.float32[::1], types.uint16[::1], types.uint16[:, ::1],
           types.uint16[:, ::1], types.float32[:, ::1])
    ptx, _ = compile_ptx_for(_helpers_kernel, sig, cc)
    for text in ("shfl.sync.bfly", "cp.async.cg.shared.global", "ld.global.v4.f32",
                 "ld.global.nc.v4.f32", "st.global.v4.u32", "cvt.rn.f16x2.f32",
                 "cvt.rn.bf16x2.f32", "st.global.b32"):
        assert text in ptx, text
    assemble(ptx, CHECK_ARCHS[cc])


@pytest.mark.parametrize("cc", list(CHECK_ARCHS), ids=list(CHECK_ARCHS.values()))
def test_example_matmul_compiles_without_spills(cc):
    from kaionb._toolchain import parse_report

    example = _load_example()
    sig = (types.uint16[:, ::1],) * 3
    ptx, _ = compile_ptx_for(example._matmul_f16_kernel.py_func, sig, cc)
    assert ptx.count("mma.sync.aligned.m16n8k16") == 16
    report = parse_report(assemble(ptx, CHECK_ARCHS[cc]))
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0


def test_fragment_maps_and_swizzle_run_in_the_simulator():
    code = (
        "import numpy as np\n"
        "from numba import cuda\n"
        "from kaionb.kernels.helpers import frag_a_m16n8k16, swizzled_index\n"
        "@cuda.jit\n"
        "def k(out):\n"
        "    t = cuda.threadIdx.x\n"
        "    r, c = frag_a_m16n8k16(t, 7)\n"
        "    out[t] = swizzled_index(r, c, 64)\n"
        "out = np.zeros(32, np.int64)\n"
        "k[1, 32](out)\n"
        "print('RESULT', out[5], out[31])\n"
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    # lane 5: (9, 11) -> 9·64 + (1 ^ 1)·8 + 3 = 579; lane 31: (15, 15) -> 960 + (1 ^ 7)·8 + 7.
    assert "RESULT 579 1015" in out.stdout, out.stderr


def test_example_exits_zero_without_gpu():
    if cuda.is_available():
        pytest.skip("a GPU is present: the example runs for real in the gpu tests")
    env = {**os.environ, "PYTHONPATH": REPO}
    path = os.path.join(REPO, "examples", "writing_kernels_matmul.py")
    out = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "no CUDA GPU" in out.stdout


# ----------------------------------------------------------------------------- GPU


@gpu
@needs_gpu
@pytest.mark.parametrize("threads", [32, 96, 256, 1024])
def test_warp_and_block_reductions(threads):
    @cuda.jit
    def k(x, out):
        s = cuda.shared.array(32, float32)
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        v = x[b, t]
        ws, wm = H.warp_sum(v), H.warp_max(v)
        bs, bm = H.block_sum(v, s), H.block_max(v, s)
        out[0, b, t], out[1, b, t], out[2, b, t], out[3, b, t] = ws, wm, bs, bm

    blocks = 3
    x = RNG.standard_normal((blocks, threads)).astype(np.float32)
    x[1] -= 100  # all-negative block: max must not come from a padding zero
    out = cuda.to_device(np.full((4, blocks, threads), np.nan, np.float32))
    k[blocks, threads](cuda.to_device(x), out)
    got = out.copy_to_host()
    xw = x.reshape(blocks, threads // 32, 32).astype(np.float64)
    ws = np.repeat(xw.sum(-1), 32, -1).reshape(blocks, threads)
    wm = np.repeat(xw.max(-1), 32, -1).reshape(blocks, threads)
    np.testing.assert_allclose(got[0], ws, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], wm.astype(np.float32))
    np.testing.assert_allclose(got[2], np.broadcast_to(x.sum(1, keepdims=True), x.shape),
                               rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got[3], np.broadcast_to(x.max(1, keepdims=True), x.shape))


@gpu
@needs_gpu
@pytest.mark.parametrize("row0,col0", [(0, 0), (40, 24), (70, 48)])
def test_cp_async_tile_loader_zero_fills_edges(row0, col0):
    ROWS, COLS = 32, 64  # noqa: N806 (compile-time tile sizes)

    @cuda.jit
    def k(src, out):
        tile = cuda.shared.array(2048, uint16)
        t = cuda.threadIdx.x
        for i in range(t, 2048, 128):
            tile[i] = 0xBEEF
        cuda.syncthreads()
        H.cp_async_tile_16b(tile, src, row0, col0, ROWS, COLS, t, 128)
        P.cp_async_commit_group()
        P.cp_async_wait_all()
        cuda.syncthreads()
        for i in range(t, 2048, 128):
            out[i // COLS, i % COLS] = tile[H.swizzled_index(i // COLS, i % COLS, COLS)]

    src = RNG.integers(1, 2**16, (90, 72), dtype=np.uint16)  # 90 rows, 72 cols (K % 8 == 0)
    out = cuda.to_device(np.full((ROWS, COLS), 0xDEAD, np.uint16))
    k[1, 128](cuda.to_device(src), out)
    expected = np.zeros((ROWS, COLS), np.uint16)
    part = src[row0:row0 + ROWS, col0:col0 + COLS]
    expected[: part.shape[0], : part.shape[1]] = part
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@gpu
@needs_gpu
def test_vector_helpers_with_tail():
    @cuda.jit
    def k(x, u, out, out_u, n):
        i = cuda.grid(1) * 4
        if i < out.shape[0]:
            H.store_f32x4_masked(out, i, n, H.load_f32x4_masked(x, i, n, -1.0))
        if i + 4 <= u.shape[0]:
            a = H.load_u32x4(u, i)
            b = H.load_u32x4_readonly(u, i)
            H.store_u32x4(out_u, i, (a[0] + b[3], a[1], a[2], a[3]))
            v = H.load_f32x4(x, i)
            w = H.load_f32x4_readonly(x, i)
            H.store_f32x4(out, out.shape[0] - 4 - i, (v[0] * w[1], v[1], v[2], v[3]))

    n = 1001  # not a multiple of 4
    x = RNG.standard_normal(1004).astype(np.float32)
    u = RNG.integers(0, 2**31, 1004, dtype=np.uint32)
    out = cuda.to_device(np.full(2008, np.nan, np.float32))
    out_u = cuda.to_device(np.full(1004, 0xDEADBEEF, np.uint32))
    k[8, 128](cuda.to_device(x), cuda.to_device(u), out, out_u, n)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:n], x[:n])
    assert np.isnan(got[n:1004]).all()  # masked store left the tail alone
    head = x.reshape(-1, 4).copy()
    head[:, 0] *= head[:, 1]
    np.testing.assert_array_equal(got[1004:], head[::-1].reshape(-1))
    eu = u.reshape(-1, 4).copy()
    eu[:, 0] += eu[:, 3]
    np.testing.assert_array_equal(out_u.copy_to_host(), eu.reshape(-1))


@gpu
@needs_gpu
@pytest.mark.parametrize("n", [8, 7])  # 7: odd width takes the element-wise path
def test_epilogue_stores_with_edges(n):
    @cuda.jit
    def k(d, o16, ob16, o32):
        lane = cuda.threadIdx.x
        frag = (d[lane, 0], d[lane, 1], d[lane, 2], d[lane, 3])
        H.store_c_frag_f16(o16, 0, 0, lane, frag)
        H.store_c_frag_bf16(ob16, 0, 0, lane, frag)
        H.store_c_frag_f32(o32, 0, 0, lane, frag)

    m = 13  # rows 13..15 of the fragment fall outside
    d = (RNG.standard_normal((32, 4)) * 10).astype(np.float32)
    o16 = cuda.to_device(np.full((m, n), 0xDEAD, np.uint16))
    ob16 = cuda.to_device(np.full((m, n), 0xDEAD, np.uint16))
    o32 = cuda.to_device(np.full((m, n), np.nan, np.float32))
    k[1, 32](cuda.to_device(d), o16, ob16, o32)
    full = np.zeros((16, 8), np.float32)
    for lane in range(32):
        for i in range(4):
            full[H.frag_c_m16n8.py_func(lane, i)] = d[lane, i]
    ref = full[:m, :n]
    np.testing.assert_array_equal(o32.copy_to_host(), ref)
    np.testing.assert_array_equal(o16.copy_to_host(), ref.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(
        ob16.copy_to_host(), ref.astype(ml_dtypes.bfloat16).view(np.uint16)
    )


@gpu
@needs_gpu
@pytest.mark.parametrize("m,n,k", [(64, 64, 32), (100, 72, 40), (129, 8, 8), (300, 200, 264)])
def test_example_matmul_matches_numpy(m, n, k):
    example = _load_example()
    err, finite = example.check(m, n, k, RNG)
    assert finite and err < 2e-3, err


@gpu
@needs_gpu
@pytest.mark.skipif(not cuda.is_available()
                    or cuda.get_current_device().compute_capability < (9, 0),
                    reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("size", [2, 8])
def test_cluster_reducers(size):
    """Every thread of every CTA of a cluster gets the cluster's sum and max, with the same
    bits in every CTA; separate clusters stay separate."""
    import kaionb
    from kaionb.kernels.launch import kernel

    cluster_sum, cluster_max = H.cluster_reducers(size)

    @kernel(["void(float32[:, :], float32[:, :], float32[:, :])"],
            name=f"_test_cluster_reducers_{size}", min_cc=(9, 0))
    def reduce_over_cluster(x, sums, maxes):
        scratch = cuda.shared.array(32, float32)
        slots = cuda.shared.array(2, float32)
        b = cuda.blockIdx.x
        t = cuda.threadIdx.x
        v = x[b, t]
        sums[b, t] = cluster_sum(v, scratch, slots, 0)
        maxes[b, t] = cluster_max(v, scratch, slots, 1)
        P.cluster_arrive()
        P.cluster_wait()

    clusters, threads = 3, 128
    x = RNG.standard_normal((clusters * size, threads)).astype(np.float32)
    x[size:2 * size] -= 50  # an all-negative cluster: its max is no padding zero
    sums = kaionb.asarray(np.full(x.shape, np.nan, np.float32))
    maxes = kaionb.asarray(np.full(x.shape, np.nan, np.float32))
    compiled = reduce_over_cluster[reduce_over_cluster.signatures[0]]
    compiled((clusters * size,), (threads,), (kaionb.asarray(x), sums, maxes),
             cluster=(size, 1, 1))
    got_s, got_m = sums.get(), maxes.get()
    per = x.reshape(clusters, size * threads).astype(np.float64)
    for c in range(clusters):
        block = slice(c * size, (c + 1) * size)
        assert np.unique(got_s[block]).size == 1  # one value, bit for bit, in every CTA
        np.testing.assert_allclose(got_s[block][0, 0], per[c].sum(), rtol=1e-5, atol=1e-3)
        assert (got_m[block] == np.float32(per[c].max())).all()
