"""kaionb.ptx_patches: every instruction compiles, assembles and computes what the ISA says.

CPU part (runs in CI): each instruction is compiled inside a tiny kernel for sm_80, sm_89
and sm_90a (Hopper ones for sm_90a only), assembled by ptxas, and the PTX is checked to
contain the instruction. GPU part (marked ``gpu``): each instruction against a NumPy model
of its PTX-ISA semantics on random inputs, outputs poisoned first.
"""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, types

import kaionb.kernels.helpers as H
import kaionb.ptx_patches as P
from kaionb._toolchain import compile_ptx as compile_ptx_for
from kaionb._toolchain import CHECK_ARCHS, assemble

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

U32, F32 = types.uint32[::1], types.float32[::1]
SIG = (U32, F32)


# One tiny kernel per instruction; each writes its results so nothing is optimised away.
def k_mma_f16(u, f):
    d = P.mma_m16n8k16_f32_f16((u[0], u[1], u[2], u[3]), (u[4], u[5]), (f[0], f[1], f[2], f[3]))
    f[0], f[1], f[2], f[3] = d


def k_mma_bf16(u, f):
    d = P.mma_m16n8k16_f32_bf16((u[0], u[1], u[2], u[3]), (u[4], u[5]), (f[0], f[1], f[2], f[3]))
    f[0], f[1], f[2], f[3] = d


def k_mma_f16acc(u, f):
    d = P.mma_m16n8k16_f16_f16((u[0], u[1], u[2], u[3]), (u[4], u[5]), (u[6], u[7]))
    u[0], u[1] = d


def k_mma_s8(u, f):
    c = (np.int32(u[6]), np.int32(u[7]), np.int32(u[8]), np.int32(u[9]))
    d = P.mma_m16n8k32_s32_s8((u[0], u[1], u[2], u[3]), (u[4], u[5]), c)
    u[0], u[1], u[2], u[3] = d


def k_mma_tf32(u, f):
    d = P.mma_m16n8k8_f32_tf32((u[0], u[1], u[2], u[3]), (u[4], u[5]), (f[0], f[1], f[2], f[3]))
    f[0], f[1], f[2], f[3] = d


def _ldmatrix_kernel(fn, count):
    def k(u, f):
        s = cuda.shared.array(256, types.uint32)
        s[cuda.threadIdx.x] = u[cuda.threadIdx.x]
        cuda.syncthreads()
        r = fn(P.shared_addr(s, (cuda.threadIdx.x % 32) * 4))
        if count == 1:
            u[cuda.threadIdx.x] = r
        else:
            for j in range(count):
                u[cuda.threadIdx.x * count + j] = r[j]

    return k


def _cp_async_kernel(fn):
    def k(u, f):
        s = cuda.shared.array(64, types.uint32)
        i = cuda.threadIdx.x
        fn(P.shared_addr(s, (i % 16) * 4), P.global_addr(u, i * 4), u[0])
        P.cp_async_commit_group()
        P.cp_async_wait_group(1)
        P.cp_async_wait_all()
        cuda.syncthreads()
        u[i] = s[i % 64]

    return k


def k_ld_global(u, f):
    a = P.ld_global_v4_u32(P.global_addr(u, 4))
    b = P.ld_global_nc_v4_u32(P.global_addr(u, 8))
    c = P.ld_global_nc_stream_v4_u32(P.global_addr(u, 16))  # words no store here touches
    x = P.ld_global_v4_f32(P.global_addr(f, 4))
    y = P.ld_global_nc_v4_f32(P.global_addr(f, 8))
    P.st_global_v4_u32(P.global_addr(u, 0), (a[0], b[1], c[2], b[3]))
    P.st_global_v4_f32(P.global_addr(f, 0), (x[0], y[1], x[2], y[3]))
    P.st_global_b32(P.global_addr(u, 12), a[1] + P.ld_global_nc_u32(P.global_addr(u, 16)))


def k_shared_vec(u, f):
    s = cuda.shared.array(64, types.uint32)
    i = cuda.threadIdx.x
    P.st_shared_v4_u32(P.shared_addr(s, (i % 16) * 4), (u[0], u[1], u[2], u[3]))
    P.st_shared_v2_u32(P.shared_addr(s, (i % 32) * 2), (u[4], u[5]))
    cuda.syncthreads()
    a = P.ld_shared_v4_u32(P.shared_addr(s, (i % 16) * 4))
    b = P.ld_shared_v2_u32(P.shared_addr(s, (i % 32) * 2))
    u[i] = a[0] + a[3] + b[1]


def k_convert(u, f):
    u[0] = P.cvt_rn_f16x2_f32(f[0], f[1])
    u[1] = P.cvt_rn_bf16x2_f32(f[0], f[1])
    f[2], f[3] = P.f16x2_to_f32x2(u[2])
    f[4], f[5] = P.bf16x2_to_f32x2(u[3])
    u[4] = P.cvt_rn_f16_s8(u[4])
    u[5] = P.prmt_b32(u[5], u[6], u[7])
    u[6] = P.lop3_b32(u[5], u[6], u[7], 0xEA)


def k_int4(u, f):
    u[0], u[1], u[2], u[3] = P.int4x8_to_f16x2x4(u[4])


def k_int4_offset(u, f):
    u[0], u[1], u[2], u[3] = P.int4x8_to_f16x2x4_offset(u[4], u[5], u[6])
    u[4], u[5], u[6], u[7] = P.int4x8_to_bf16x2x4_offset(u[0], u[1], u[2])


def k_fast_math(u, f):
    f[0] = P.ex2_approx_f32(f[0])
    f[1] = P.tanh_approx_f32(f[1])
    f[2] = P.rcp_approx_f32(f[2])
    f[3] = P.rsqrt_approx_f32(f[3])
    u[0] = P.fma_rn_f16x2(u[0], u[1], u[2])
    u[1] = P.fma_rn_bf16x2(u[0], u[1], u[2])


def k_wgmma(u, f):
    acc = P.accumulator_zeros(32)
    P.wgmma_fence()
    acc = P.wgmma_m64n64k16_f32_f16(u[0], u[1], 0, 0, 0, acc)
    acc = P.wgmma_m64n64k16_f32_bf16(u[0], u[1], 1, 0, 0, acc)
    P.wgmma_commit_group()
    P.wgmma_wait_group(0)
    for j in range(32):
        f[cuda.threadIdx.x * 32 + j] = acc[j]


def k_wgmma_n128(u, f):
    acc = P.accumulator_zeros(64)
    P.wgmma_fence()
    acc = P.wgmma_m64n128k16_f32_f16(u[0], u[1], 0, 0, 0, acc)
    acc = P.wgmma_m64n128k16_f32_bf16(u[0], u[1], 1, 0, 0, acc)
    P.wgmma_commit_group()
    P.wgmma_wait_group(0)
    for j in range(64):
        f[cuda.threadIdx.x * 64 + j] = acc[j]


STORE_F32_N256 = P.st_global_accumulator(256, "f32")
STORE_BF16_N256 = P.st_global_accumulator(256, "bf16")
STAGE_F16_N256 = P.st_shared_accumulator_swizzled(256, "f16", 1, 2)


def k_wgmma_n256_trans(u, f):
    """m64n256k16 with both transpose bits, and the accumulator stores."""
    acc = P.accumulator_zeros(128)
    P.wgmma_fence()
    acc = P.wgmma_m64n256k16_f32_f16(u[0], u[1], 0, 1, 1, acc)
    acc = P.wgmma_m64n256k16_f32_bf16(u[0], u[1], 1, 1, 0, acc)
    P.wgmma_commit_group()
    P.wgmma_wait_group(0)
    STORE_F32_N256(P.global_addr(f, 0), P.global_addr(f, 8), u[2], u[3], u[4], acc)
    STORE_BF16_N256(P.global_addr(u, 0), P.global_addr(u, 8), u[2], u[3], u[4], acc)
    STAGE_F16_N256(u[5], u[6], acc)


def k_cluster(u, f):
    """Cluster rank and index, barriers, remote arrive and loads, multicast TMA, TMA store and bulk
    groups, named barrier, setmaxnreg."""
    bar = cuda.shared.array(1, types.uint64)
    s = cuda.shared.array(64, types.uint32)
    b = P.shared_addr(bar, 0)
    rank = P.cluster_ctarank()
    if cuda.threadIdx.x == 0:
        P.mbarrier_init(b, 2)
        P.fence_mbarrier_init_cluster()
    P.cluster_arrive()
    P.cluster_wait()
    if cuda.threadIdx.x < 128:
        P.setmaxnreg_dec(40)
        P.cp_async_bulk_tensor_2d_multicast(P.shared_addr(s, 0), P.global_addr(u, 64), 0, 0,
                                            b, 3)
        P.mbarrier_wait(b, 0)
    else:
        P.setmaxnreg_inc(232)
        P.mbarrier_arrive_remote(b, rank ^ 1)
        P.bar_sync_threads(1, 128)
        P.cp_async_bulk_tensor_2d_shared_to_global(P.global_addr(u, 64), 0, 0,
                                                   P.shared_addr(s, 0))
        P.cp_async_bulk_commit_group()
        P.cp_async_bulk_wait_group_read(0)
        P.cp_async_bulk_wait_group(0)
    u[cuda.threadIdx.x] = s[cuda.threadIdx.x % 64] + rank
    f[cuda.threadIdx.x] = P.ld_shared_cluster_f32(P.shared_addr(s, 1), rank ^ 1)
    v = P.ld_shared_cluster_v4_f32(P.shared_addr(s, 4), rank ^ 1)
    f[cuda.threadIdx.x + 1] = v[0] + v[3] + P.cluster_id_x()


SEND8 = P.st_async_cluster_f32(8, 2048)
ADD8 = P.add_shared_f32(8, 2048)


def k_exchange(u, f):
    """The split-K exchange: relaxed start-up arrive, st.async into the peer with
    complete_tx, a cluster-scope mbarrier wait, the shared add."""
    bar = cuda.shared.array(1, types.uint64)
    s = cuda.shared.array(2048, types.float32, alignment=16)
    b = P.shared_addr(bar, 0)
    if cuda.threadIdx.x == 0:
        P.mbarrier_init(b, 1)
        P.fence_mbarrier_init_cluster()
    cuda.syncthreads()
    P.cluster_arrive_relaxed()
    if cuda.threadIdx.x == 0:
        P.mbarrier_arrive_expect_tx(b, 4096)
    P.cluster_wait()
    v = (f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7])
    at = P.shared_addr(s, 4 * cuda.threadIdx.x)
    SEND8(at, b, P.cluster_ctarank() ^ 1, v)
    P.mbarrier_wait_cluster(b, 0)
    w = ADD8(at, v)
    f[cuda.threadIdx.x] = w[0] + w[7]


def k_mbarrier(u, f):
    bar = cuda.shared.array(1, types.uint64)
    s = cuda.shared.array(64, types.uint32)
    b = P.shared_addr(bar, 0)
    if cuda.threadIdx.x == 0:
        P.mbarrier_init(b, 1)
    P.fence_proxy_async_shared()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        P.mbarrier_arrive_expect_tx(b, 256)
        P.cp_async_bulk_global_to_shared(P.shared_addr(s, 0), P.global_addr(u, 0), 256, b)
        P.prefetch_tensormap(P.global_addr(u, 64))
        P.cp_async_bulk_tensor_2d_global_to_shared(
            P.shared_addr(s, 0), P.global_addr(u, 64), 0, 0, b
        )
    else:
        P.mbarrier_arrive(b)
    while P.mbarrier_try_wait_parity(b, 0) == 0:
        pass
    u[cuda.threadIdx.x] = s[cuda.threadIdx.x % 64]


def k_desc(u, f):
    s = cuda.shared.array(64, types.uint32)
    u[0] = P.make_smem_desc(P.shared_addr(s, 0), 16, 1024, 128) >> 32


# (kernel, PTX text that must appear, Hopper-only)
CASES = {
    "mma_f16": (k_mma_f16, ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"], False),
    "mma_bf16": (k_mma_bf16, ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"], False),
    "mma_f16acc": (k_mma_f16acc, ["mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"], False),
    "mma_s8": (k_mma_s8, ["mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"], False),
    "mma_tf32": (k_mma_tf32, ["mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"], False),
    **{
        f"ldmatrix_x{n}{t}": (
            _ldmatrix_kernel(getattr(P, f"ldmatrix_x{n}{t}"), n),
            [f"ldmatrix.sync.aligned.m8n8.x{n}{t.replace('_', '.')}.shared.b16"],
            False,
        )
        for n in (1, 2, 4)
        for t in ("", "_trans")
    },
    **{
        f"cp_async_{c}_{n}": (
            _cp_async_kernel(getattr(P, f"cp_async_{c}_{n}")),
            [f"cp.async.{c}.shared.global", "cp.async.commit_group", "cp.async.wait_group 1",
             "cp.async.wait_all"],
            False,
        )
        for c, n in (("ca", 4), ("ca", 8), ("ca", 16), ("cg", 16))
    },
    "ld_st_global": (
        k_ld_global,
        ["ld.global.v4.u32", "ld.global.nc.v4.u32", "ld.global.v4.f32", "ld.global.nc.v4.f32",
         "ld.global.nc.u32", "ld.global.nc.L1::no_allocate.L2::256B.v4.u32", "st.global.v4.u32",
         "st.global.v4.f32", "st.global.b32"],
        False,
    ),
    "shared_vec": (
        k_shared_vec,
        ["st.shared.v4.u32", "st.shared.v2.u32", "ld.shared.v4.u32", "ld.shared.v2.u32"],
        False,
    ),
    "convert": (
        k_convert,
        ["cvt.rn.f16x2.f32", "cvt.rn.bf16x2.f32", "cvt.f32.f16", "cvt.rn.f16.s8", "prmt.b32",
         "lop3.b32"],
        False,
    ),
    "int4": (k_int4, ["xor.b32", "prmt.b32", "lop3.b32", "fma.rn.f16x2"], False),
    "int4_offset": (k_int4_offset, ["xor.b32", "shr.b32", "prmt.b32", "lop3.b32",
                                    "fma.rn.f16x2", "fma.rn.bf16x2"], False),
    "fast_math": (
        k_fast_math,
        ["ex2.approx.ftz.f32", "tanh.approx.f32", "rcp.approx.ftz.f32", "rsqrt.approx.ftz.f32",
         "fma.rn.f16x2", "fma.rn.bf16x2"],
        False,
    ),
    "desc": (k_desc, [], False),
    "wgmma_n64": (
        k_wgmma,
        ["wgmma.fence.sync.aligned", "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
         "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
         "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0"],
        True,
    ),
    "wgmma_n128": (
        k_wgmma_n128,
        ["wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
         "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"],
        True,
    ),
    "wgmma_n256_trans": (
        k_wgmma_n256_trans,
        ["wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16",
         "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "p, 1, 1, 1, 1;",
         "p, 1, 1, 1, 0;", "st.global.v2.f32", "cvt.rn.bf16x2.f32", "st.global.b32",
         "cvt.rn.f16x2.f32", "st.shared.b32"],
        True,
    ),
    "cluster": (
        k_cluster,
        ["%cluster_ctarank", "fence.mbarrier_init.release.cluster",
         "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire",
         "mapa.shared::cluster.u32", "mbarrier.arrive.shared::cluster.b64",
         "ld.shared::cluster.f32", "ld.shared::cluster.v4.f32", "%clusterid.x",
         ".multicast::cluster", "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
         "cp.async.bulk.commit_group", "cp.async.bulk.wait_group.read 0",
         "cp.async.bulk.wait_group 0", "bar.sync 1, 128", "setmaxnreg.dec.sync.aligned.u32 40",
         "setmaxnreg.inc.sync.aligned.u32 232", "mbarrier.try_wait.parity"],
        True,
    ),
    "exchange": (
        k_exchange,
        ["barrier.cluster.arrive.relaxed", "mapa.shared::cluster.u32",
         "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32",
         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64", "ld.shared.v4.f32",
         "add.rn.f32"],
        True,
    ),
    "mbarrier_bulk": (
        k_mbarrier,
        ["mbarrier.init.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
         "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
         "fence.proxy.async.shared::cta", "cp.async.bulk.shared::cluster.global",
         "cp.async.bulk.tensor.2d", "prefetch.tensormap"],
        True,
    ),
}

ARCH_CASES = [
    pytest.param(name, cc, id=f"{name}-{arch}")
    for name, (_, _, hopper) in CASES.items()
    for cc, arch in CHECK_ARCHS.items()
    if not hopper or cc == (9, 0, "a")
]


@pytest.mark.parametrize("name,cc", ARCH_CASES)
def test_instruction_compiles_and_assembles(name, cc):
    kernel, expected, _ = CASES[name]
    ptx, _ = compile_ptx_for(kernel, SIG, cc)
    for text in expected:
        assert text in ptx, f"{text!r} missing from the PTX of {name}"
    assemble(ptx, CHECK_ARCHS[cc])


@pytest.mark.parametrize("cc", [(8, 0), (8, 9)])
@pytest.mark.parametrize("name", ["wgmma_n64", "mbarrier_bulk", "cluster"])
def test_hopper_instruction_rejected_before_sm90(name, cc):
    kernel = CASES[name][0]
    with pytest.raises(P.ArchitectureError, match=r"needs sm_90.*compiled for sm_8"):
        compile_ptx_for(kernel, SIG, cc)


def test_wgmma_error_names_instruction():
    with pytest.raises(P.ArchitectureError) as info:
        compile_ptx_for(k_wgmma, SIG, (8, 9))
    assert "wgmma" in str(info.value) and "sm_90a" in str(info.value)


def test_int4_magic_constants():
    """The f16 constants baked into int4x8_to_f16x2x4's fma: {1, 1/16} and {-1032, -72}."""
    scale = np.array([1.0, 1 / 16], dtype=np.float16).view(np.uint32)[0]
    offset = np.array([-1032.0, -72.0], dtype=np.float16).view(np.uint32)[0]
    assert (hex(scale), hex(offset)) == ("0x2c003c00", "0xd480e408")


def test_immediate_operand_must_be_constant():
    def k(u, f):
        P.cp_async_wait_group(u[0])

    with pytest.raises(Exception, match="cp_async_wait_group"):
        compile_ptx_for(k, SIG, (8, 0))


def test_simulator_raises_naming_the_instruction():
    code = (
        "import numpy as np\n"
        "from numba import cuda\n"
        "import kaionb.ptx_patches as P\n"
        "@cuda.jit\n"
        "def k(a):\n"
        "    a[0] = P.tanh_approx_f32(a[0])\n"
        "try:\n"
        "    k[1, 1](np.ones(1, np.float32))\n"
        "except NotImplementedError as e:\n"
        "    print('RAISED', e)\n"
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "RAISED" in out.stdout and "tanh.approx.f32" in out.stdout, out.stderr


# ---------------------------------------------------------------------------------------
# GPU: each instruction against a NumPy model of its PTX-ISA semantics.
# ---------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not cuda.is_available(), reason="no CUDA GPU")
RNG = np.random.default_rng(20261122)
POISON = np.uint32(0xDEADBEEF)


def _is_sm90():
    return cuda.is_available() and cuda.get_current_device().compute_capability == (9, 0)


def _pack16(lo, hi):
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)


def _f16_bits(x):
    return np.asarray(x, np.float16).view(np.uint16)


def _bf16_bits(x):
    return np.asarray(x, ml_dtypes.bfloat16).view(np.uint16)


def _pack_fragment(mat, frag_map, nregs, per_reg, bits):
    """(32, nregs) uint32: lane's registers, element i at bits (i % per_reg)·bits."""
    regs = np.zeros((32, nregs), np.uint32)
    mask = (1 << bits) - 1
    for lane in range(32):
        for i in range(nregs * per_reg):
            r, c = frag_map(lane, i)
            regs[lane, i // per_reg] |= np.uint32((int(mat[r, c]) & mask) << (bits * (i % per_reg)))
    return regs


def _unpack_c(d):
    """(32, 4) C fragments -> the 16×8 matrix."""
    out = np.full((16, 8), np.nan)
    for lane in range(32):
        for i in range(4):
            r, c = H.frag_c_m16n8.py_func(lane, i)
            out[r, c] = d[lane, i]
    return out


def _mma_kernel(fn, c_dtype):
    def k(a, b, c, d):
        lane = cuda.threadIdx.x
        cf = (c[lane, 0], c[lane, 1], c[lane, 2], c[lane, 3])
        r = fn((a[lane, 0], a[lane, 1], a[lane, 2], a[lane, 3]), (b[lane, 0], b[lane, 1]), cf)
        for i in range(4):
            d[lane, i] = r[i]

    return cuda.jit(k)


def _run_mma(fn, a_regs, b_regs, c_frag, d_dtype):
    d = np.full((32, 4), np.nan if d_dtype == np.float32 else -12345, d_dtype)
    dd = cuda.to_device(d)
    _mma_kernel(fn, d_dtype)[1, 32](
        cuda.to_device(a_regs), cuda.to_device(b_regs), cuda.to_device(c_frag), dd
    )
    return dd.copy_to_host()


def _c_fragment(c):
    return np.array(
        [[c[H.frag_c_m16n8.py_func(lane, i)] for i in range(4)] for lane in range(32)]
    )


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_m16n8k16_f32(dtype):
    a = RNG.standard_normal((16, 16))
    b = RNG.standard_normal((16, 8))
    c = RNG.standard_normal((16, 8)).astype(np.float32)
    cast = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    a, b = a.astype(cast), b.astype(cast)
    a_regs = _pack_fragment(a.view(np.uint16), H.frag_a_m16n8k16.py_func, 4, 2, 16)
    b_regs = _pack_fragment(b.view(np.uint16), H.frag_b_m16n8k16.py_func, 2, 2, 16)
    fn = P.mma_m16n8k16_f32_f16 if dtype == "f16" else P.mma_m16n8k16_f32_bf16
    d = _unpack_c(_run_mma(fn, a_regs, b_regs, _c_fragment(c), np.float32))
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-5)


@gpu
@needs_gpu
def test_mma_m16n8k16_f16_accumulate():
    a = RNG.standard_normal((16, 16)).astype(np.float16)
    b = RNG.standard_normal((16, 8)).astype(np.float16)
    c = RNG.standard_normal((16, 8)).astype(np.float16)
    a_regs = _pack_fragment(a.view(np.uint16), H.frag_a_m16n8k16.py_func, 4, 2, 16)
    b_regs = _pack_fragment(b.view(np.uint16), H.frag_b_m16n8k16.py_func, 2, 2, 16)
    c16 = _c_fragment(c.view(np.uint16))
    c_regs = np.stack([_pack16(c16[:, 0], c16[:, 1]), _pack16(c16[:, 2], c16[:, 3])], 1)

    @cuda.jit
    def k(a, b, c, d):
        lane = cuda.threadIdx.x
        r = P.mma_m16n8k16_f16_f16(
            (a[lane, 0], a[lane, 1], a[lane, 2], a[lane, 3]), (b[lane, 0], b[lane, 1]),
            (c[lane, 0], c[lane, 1]),
        )
        d[lane, 0], d[lane, 1] = r

    d = cuda.to_device(np.full((32, 2), POISON, np.uint32))
    k[1, 32](cuda.to_device(a_regs), cuda.to_device(b_regs), cuda.to_device(c_regs), d)
    d = d.copy_to_host()
    halves = np.stack([d[:, 0] & 0xFFFF, d[:, 0] >> 16, d[:, 1] & 0xFFFF, d[:, 1] >> 16], 1)
    out = _unpack_c(halves.astype(np.uint16).view(np.float16).astype(np.float64))
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2)


@gpu
@needs_gpu
def test_mma_m16n8k32_s8():
    a = RNG.integers(-128, 128, (16, 32))
    b = RNG.integers(-128, 128, (32, 8))
    c = RNG.integers(-(2**20), 2**20, (16, 8)).astype(np.int32)
    a_regs = _pack_fragment(a, H.frag_a_m16n8k32_s8.py_func, 4, 4, 8)
    b_regs = _pack_fragment(b, H.frag_b_m16n8k32_s8.py_func, 2, 4, 8)
    d = _unpack_c(_run_mma(P.mma_m16n8k32_s32_s8, a_regs, b_regs, _c_fragment(c), np.int32))
    np.testing.assert_array_equal(d, a @ b + c)


@gpu
@needs_gpu
def test_mma_m16n8k8_tf32():
    # Inputs exactly representable in tf32 (10 mantissa bits), so only the sum rounds.
    a = (RNG.standard_normal((16, 8)).astype(np.float32).view(np.uint32) & 0xFFFFE000)
    b = (RNG.standard_normal((8, 8)).astype(np.float32).view(np.uint32) & 0xFFFFE000)
    c = RNG.standard_normal((16, 8)).astype(np.float32)
    a_regs = _pack_fragment(a, H.frag_a_m16n8k8_tf32.py_func, 4, 1, 32)
    b_regs = _pack_fragment(b, H.frag_b_m16n8k8_tf32.py_func, 2, 1, 32)
    d = _unpack_c(_run_mma(P.mma_m16n8k8_f32_tf32, a_regs, b_regs, _c_fragment(c), np.float32))
    ref = a.view(np.float32).astype(np.float64) @ b.view(np.float32).astype(np.float64) + c
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-5)


def _ldmatrix_test_kernel(fn, count):
    def k(src, out):
        s = cuda.shared.array(256, types.uint16)
        lane = cuda.threadIdx.x
        for i in range(lane, 256, 32):
            s[i] = src[i]
        cuda.syncthreads()
        # Lane l names row l % 8 of matrix l // 8 (lanes past the last matrix wrap).
        row = lane % (8 * count)
        r = fn(P.shared_addr(s, row * 8))
        if count == 1:
            out[lane, 0] = r
        else:
            for j in range(count):
                out[lane, j] = r[j]

    return cuda.jit(k)


@gpu
@needs_gpu
@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix(count, trans):
    src = RNG.integers(0, 2**16, 256, dtype=np.uint16)
    fn = getattr(P, f"ldmatrix_x{count}{'_trans' if trans else ''}")
    out = cuda.to_device(np.full((32, count), POISON, np.uint32))
    _ldmatrix_test_kernel(fn, count)[1, 32](cuda.to_device(src), out)
    mats = src.reshape(4, 8, 8)
    lane = np.arange(32)
    for j in range(count):
        m = mats[j].T if trans else mats[j]
        expected = _pack16(m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1])
        np.testing.assert_array_equal(out.copy_to_host()[:, j], expected)


def _cp_async_test_kernel(fn, size):
    words = size // 4

    def k(src, nbytes, out):
        s = cuda.shared.array(64, types.uint32)
        i = cuda.threadIdx.x
        for w in range(words):
            s[i * words + w] = POISON
        cuda.syncthreads()
        fn(P.shared_addr(s, i * words), P.global_addr(src, i * words), nbytes[i])
        P.cp_async_commit_group()
        P.cp_async_wait_group(0)
        cuda.syncthreads()
        for w in range(words):
            out[i * words + w] = s[i * words + w]

    return cuda.jit(k)


@gpu
@needs_gpu
@pytest.mark.parametrize("name,size", [("ca_4", 4), ("ca_8", 8), ("ca_16", 16), ("cg_16", 16)])
def test_cp_async_zero_fill(name, size):
    """Bytes past src_size are zero (the out-of-bounds edge of a tile); the rest copied."""
    n = 64 // (size // 4)
    src = RNG.integers(1, 2**32, 64, dtype=np.uint32)
    nbytes = RNG.choice(np.arange(0, size + 1, 4), n).astype(np.uint32)
    nbytes[:2] = (0, size)
    out = cuda.to_device(np.full(64, POISON, np.uint32))
    _cp_async_test_kernel(getattr(P, f"cp_async_{name}"), size)[1, n](
        cuda.to_device(src), cuda.to_device(nbytes), out
    )
    word = np.arange(64) % (size // 4)
    expected = np.where(word * 4 < np.repeat(nbytes, size // 4), src, 0)
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@gpu
@needs_gpu
def test_vector_memory_roundtrip():
    @cuda.jit
    def k(u, f, out_u, out_f):
        s = cuda.shared.array(128, types.uint32)
        i = cuda.threadIdx.x * 4
        P.st_shared_v4_u32(P.shared_addr(s, i), P.ld_global_v4_u32(P.global_addr(u, i)))
        cuda.syncthreads()
        a = P.ld_shared_v4_u32(P.shared_addr(s, 124 - i))
        b = P.ld_global_nc_v4_u32(P.global_addr(u, i))
        c = P.ld_global_nc_stream_v4_u32(P.global_addr(u, i))  # the same words as b
        P.st_global_v4_u32(P.global_addr(out_u, i), (a[0] ^ b[0], a[1] + c[1] - b[1], a[2],
                                                     a[3] ^ c[3] ^ b[3]))
        x = P.ld_global_v4_f32(P.global_addr(f, i))
        y = P.ld_global_nc_v4_f32(P.global_addr(f, i))
        P.st_global_v4_f32(P.global_addr(out_f, i), (x[0] + y[3], x[1], x[2], x[3]))
        cuda.syncthreads()
        v = P.ld_shared_v2_u32(P.shared_addr(s, i + 2))
        P.st_shared_v2_u32(P.shared_addr(s, i), v)
        cuda.syncthreads()
        # Zero when ld.global.nc.u32 reads u[i + 1].
        w = types.uint32(P.ld_global_nc_u32(P.global_addr(u, i + 1)) ^ u[i + 1])
        P.st_global_b32(P.global_addr(out_u, 128 + cuda.threadIdx.x), s[i] - s[i + 2] + w)

    u = RNG.integers(0, 2**32, 128, dtype=np.uint32)
    f = RNG.standard_normal(128).astype(np.float32)
    out_u = cuda.to_device(np.full(160, POISON, np.uint32))
    out_f = cuda.to_device(np.full(128, np.nan, np.float32))
    k[1, 32](cuda.to_device(u), cuda.to_device(f), out_u, out_f)
    ou = out_u.copy_to_host()
    rev = u.reshape(32, 4)[::-1].reshape(-1)
    exp = rev.copy()
    exp[0::4] ^= u[0::4]
    np.testing.assert_array_equal(ou[:128], exp)
    np.testing.assert_array_equal(ou[128:], np.zeros(32, np.uint32))
    ef = f.copy()
    ef[0::4] += f[3::4]
    np.testing.assert_array_equal(out_f.copy_to_host(), ef)


@gpu
@needs_gpu
def test_conversions_round_to_nearest_even():
    @cuda.jit
    def k(f, u, out_u, out_f):
        i = cuda.grid(1)
        if i < f.shape[0] // 2:
            out_u[0, i] = P.cvt_rn_f16x2_f32(f[2 * i], f[2 * i + 1])
            out_u[1, i] = P.cvt_rn_bf16x2_f32(f[2 * i], f[2 * i + 1])
            out_f[0, 2 * i], out_f[0, 2 * i + 1] = P.f16x2_to_f32x2(u[0, i])
            out_f[1, 2 * i], out_f[1, 2 * i + 1] = P.bf16x2_to_f32x2(u[1, i])
            out_u[2, i] = P.cvt_rn_f16_s8(u[2, i])

    n = 4096
    # Random values plus exact ties between two f16 / two bf16 neighbours.
    f = RNG.standard_normal(n).astype(np.float32) * 3
    f[:8] = [1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-11), 65504.0, 1e-6, -0.0]
    u = np.stack([
        RNG.integers(0, 2**32, n // 2, dtype=np.uint32),
        RNG.integers(0, 2**32, n // 2, dtype=np.uint32),
        np.resize(np.arange(256, dtype=np.uint32) | 0xABCD00, n // 2),
    ])
    # Keep f16/bf16 inputs finite so NaN payload handling does not enter the comparison.
    u[0] &= ~np.uint32(0x40004000)
    u[1] &= ~np.uint32(0x40004000)
    out_u = cuda.to_device(np.full((3, n // 2), POISON, np.uint32))
    out_f = cuda.to_device(np.full((2, n), np.nan, np.float32))
    k[n // 256, 128](cuda.to_device(f), cuda.to_device(u), out_u, out_f)
    ou, of = out_u.copy_to_host(), out_f.copy_to_host()
    np.testing.assert_array_equal(ou[0], _pack16(_f16_bits(f[0::2]), _f16_bits(f[1::2])))
    np.testing.assert_array_equal(ou[1], _pack16(_bf16_bits(f[0::2]), _bf16_bits(f[1::2])))
    h = np.stack([u[0] & 0xFFFF, u[0] >> 16], 1).astype(np.uint16).reshape(-1)
    np.testing.assert_array_equal(of[0], h.view(np.float16).astype(np.float32))
    bh = np.stack([u[1] & 0xFFFF, u[1] >> 16], 1).astype(np.uint16).reshape(-1)
    np.testing.assert_array_equal(of[1], bh.view(ml_dtypes.bfloat16).astype(np.float32))
    s8 = (u[2] & 0xFF).astype(np.uint8).view(np.int8)
    np.testing.assert_array_equal(ou[2] & 0xFFFF, _f16_bits(s8.astype(np.float16)))


def int4_ref(words):
    """NumPy model: 8 signed nibbles per word (weight k at bits 4k) -> 4 f16x2 words."""
    nib = (words[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    val = np.where(nib >= 8, nib.astype(np.int64) - 16, nib.astype(np.int64))
    bits = _f16_bits(val.astype(np.float16)).astype(np.uint32)
    return bits[:, 0::2] | (bits[:, 1::2] << 16)


@gpu
@needs_gpu
def test_int4_dequant_sign_extension_and_nibble_order():
    @cuda.jit
    def k(w, out):
        i = cuda.grid(1)
        if i < w.shape[0]:
            out[i, 0], out[i, 1], out[i, 2], out[i, 3] = P.int4x8_to_f16x2x4(w[i])

    rand = RNG.integers(0, 2**32, 1000, dtype=np.uint32)
    canary = np.array([0x88888888, 0x77777777, 0xFFFFFFFF, 0x00000000], np.uint32)
    # Every value 0..15 at every nibble position, the other nibbles random.
    pos = []
    for p in range(8):
        for v in range(16):
            base = int(RNG.integers(0, 2**32))
            pos.append((base & ~(0xF << (4 * p)) | (v << (4 * p))) & 0xFFFFFFFF)
    w = np.concatenate([canary, np.array(pos, np.uint32), rand])
    out = cuda.to_device(np.full((w.size, 4), POISON, np.uint32))
    k[(w.size + 127) // 128, 128](cuda.to_device(w), out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, int4_ref(w))
    assert np.all(got[0] == _pack16(_f16_bits(-8.0), _f16_bits(-8.0)))


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_int4_offset_dequant_subtracts_each_columns_zero(dtype):
    """Output j = nibbles 2j, 2j+1 minus the zero of column a (j < 2) or b (j >= 2)."""
    convert = (P.int4x8_to_f16x2x4_offset if dtype == "f16"
               else P.int4x8_to_bf16x2x4_offset)

    @cuda.jit
    def k(w, off, out):
        i = cuda.grid(1)
        if i < w.shape[0]:
            out[i, 0], out[i, 1], out[i, 2], out[i, 3] = convert(w[i], off[i, 0], off[i, 1])

    n = 4096
    w = RNG.integers(0, 2**32, n, dtype=np.uint32)
    w[:16] = np.array([0x88888888, 0x77777777, 0xFFFFFFFF, 0] * 4, np.uint32)
    zeros = RNG.integers(-8, 8, (n, 2))
    zeros[:4] = [[-8, 7], [7, -8], [0, 0], [-8, -8]]
    bits = _f16_bits if dtype == "f16" else _bf16_bits
    lo = -(1032 + zeros) if dtype == "f16" else -(136 + zeros)
    hi = -(72 + zeros) if dtype == "f16" else -(136 + zeros)
    off = _pack16(bits(lo.astype(np.float32)), bits(hi.astype(np.float32)))
    out = cuda.to_device(np.full((n, 4), POISON, np.uint32))
    k[(n + 127) // 128, 128](cuda.to_device(w), cuda.to_device(off), out)
    nib = (w[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    val = np.where(nib >= 8, nib.astype(np.int64) - 16, nib.astype(np.int64))
    val = val - np.repeat(zeros, 4, axis=1)  # nibbles 0-3: column a, 4-7: column b
    expect = bits(val.astype(np.float32)).astype(np.uint32)
    np.testing.assert_array_equal(out.copy_to_host(), expect[:, 0::2] | (expect[:, 1::2] << 16))


@gpu
@needs_gpu
def test_prmt_lop3():
    @cuda.jit
    def k(a, b, s, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[0, i] = P.prmt_b32(a[i], b[i], s[i])
            out[1, i] = P.lop3_b32(a[i], b[i], s[i], 0xEA)
            out[2, i] = P.lop3_b32(a[i], b[i], s[i], 0x96)

    n = 512
    a, b = (RNG.integers(0, 2**32, n, dtype=np.uint32) for _ in range(2))
    s = RNG.integers(0, 2**32, n, dtype=np.uint32) & 0x7777  # default prmt mode: 4 selectors
    out = cuda.to_device(np.full((3, n), POISON, np.uint32))
    k[4, 128](cuda.to_device(a), cuda.to_device(b), cuda.to_device(s), out)
    got = out.copy_to_host()
    src = np.stack([a, b], 1).view(np.uint8).reshape(n, 8)  # bytes 0-3 of a, 4-7 of b
    sel = (s[:, None] >> (4 * np.arange(4, dtype=np.uint32))) & 0x7
    prmt = np.take_along_axis(src, sel.astype(np.int64), 1).astype(np.uint32)
    np.testing.assert_array_equal(got[0], prmt @ (1 << (8 * np.arange(4, dtype=np.uint32))))
    np.testing.assert_array_equal(got[1], (a & b) | s)
    np.testing.assert_array_equal(got[2], a ^ b ^ s)


@gpu
@needs_gpu
def test_fast_math_and_half_fma():
    @cuda.jit
    def k(x, h, out_f, out_u):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out_f[0, i] = P.ex2_approx_f32(x[i])
            out_f[1, i] = P.tanh_approx_f32(x[i])
            out_f[2, i] = P.rcp_approx_f32(x[i])
            out_f[3, i] = P.rsqrt_approx_f32(abs(x[i]))
            out_u[0, i] = P.fma_rn_f16x2(h[0, i], h[1, i], h[2, i])
            out_u[1, i] = P.fma_rn_bf16x2(h[3, i], h[4, i], h[5, i])

    n = 2048
    x = (RNG.standard_normal(n) * 4).astype(np.float32)
    vals = RNG.standard_normal((6, 2 * n))
    h = np.empty((6, n), np.uint32)
    for j in range(6):
        bits = _f16_bits(vals[j]) if j < 3 else _bf16_bits(vals[j])
        h[j] = _pack16(bits[0::2], bits[1::2])
    out_f = cuda.to_device(np.full((4, n), np.nan, np.float32))
    out_u = cuda.to_device(np.full((2, n), POISON, np.uint32))
    k[n // 128, 128](cuda.to_device(x), cuda.to_device(h), out_f, out_u)
    of, ou = out_f.copy_to_host(), out_u.copy_to_host()
    xd = x.astype(np.float64)
    np.testing.assert_allclose(of[0], np.exp2(xd), rtol=4e-7 * 8)
    np.testing.assert_allclose(of[1], np.tanh(xd), rtol=2**-10, atol=1e-6)
    np.testing.assert_allclose(of[2], 1 / xd, rtol=4e-7 * 4)
    np.testing.assert_allclose(of[3], 1 / np.sqrt(np.abs(xd)), rtol=4e-7 * 4)
    # One rounding of the exact a·b + c (exact in float64 for these inputs).
    f16 = [vals[j].astype(np.float16).astype(np.float64) for j in range(3)]
    ref16 = _f16_bits(f16[0] * f16[1] + f16[2])
    np.testing.assert_array_equal(ou[0], _pack16(ref16[0::2], ref16[1::2]))
    b16 = [vals[j].astype(ml_dtypes.bfloat16).astype(np.float64) for j in range(3, 6)]
    refb = _bf16_bits(b16[0] * b16[1] + b16[2])
    np.testing.assert_array_equal(ou[1], _pack16(refb[0::2], refb[1::2]))


@gpu
@needs_gpu
@pytest.mark.skipif(not _is_sm90(), reason="wgmma needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_wgmma_m64n64k16_vs_numpy(dtype):
    """Four m64n64k16 steps over a 64×64 (K) swizzled tile: D = A · Bᵀ, A, B K-major."""
    fn = P.wgmma_m64n64k16_f32_f16 if dtype == "f16" else P.wgmma_m64n64k16_f32_bf16

    @cuda.jit
    def k(a, b, out):
        sa = cuda.shared.array(4096, types.uint16, alignment=1024)
        sb = cuda.shared.array(4096, types.uint16, alignment=1024)
        tid = cuda.threadIdx.x
        for i in range(tid, 4096, 128):
            r, c = i // 64, i % 64
            sa[H.swizzled_index(r, c, 64)] = a[r, c]
            sb[H.swizzled_index(r, c, 64)] = b[r, c]
        P.fence_proxy_async_shared()
        cuda.syncthreads()
        acc = P.accumulator_zeros(32)
        P.wgmma_fence()
        for ks in range(4):
            # Each k-step of 16 halves starts 32 bytes further into the 128-byte rows.
            da = P.make_smem_desc(P.shared_addr(sa, 0) + 32 * ks, 16, 1024, 128)
            db = P.make_smem_desc(P.shared_addr(sb, 0) + 32 * ks, 16, 1024, 128)
            acc = fn(da, db, 1 if ks > 0 else 0, 0, 0, acc)
        P.wgmma_commit_group()
        P.wgmma_wait_group(0)
        warp, lane = tid // 32, tid % 32
        for j in range(8):
            for i in range(4):
                r = 16 * warp + lane // 4 + 8 * (i // 2)
                c = 8 * j + 2 * (lane % 4) + i % 2
                out[r, c] = acc[4 * j + i]

    cast = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    a = RNG.standard_normal((64, 64)).astype(cast)
    b = RNG.standard_normal((64, 64)).astype(cast)  # [n][k]
    out = cuda.to_device(np.full((64, 64), np.nan, np.float32))
    k[1, 128](cuda.to_device(a.view(np.uint16)), cuda.to_device(b.view(np.uint16)), out)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-4, atol=1e-4)


@gpu
@needs_gpu
@pytest.mark.skipif(not _is_sm90(), reason="clusters and st.async need sm_90")
def test_st_async_exchange_between_cluster_ctas():
    """The two CTAs of each cluster swap 8 floats a thread with st.async (complete_tx on
    the receiver's mbarrier, announced before the start-up barrier's wait) and add what
    they receive: every thread gets x[own] + x[peer] rounded once to f32."""
    import kaionb
    from kaionb.kernels.launch import kernel

    @kernel(["void(float32[:, :, :], float32[:, :, :])"], name="_test_st_async_exchange",
            min_cc=(9, 0), registered=False)
    def exchange(x, out):
        bar = cuda.shared.array(1, types.uint64)
        s = cuda.shared.array(1024, types.float32, alignment=16)  # chunk i, thread t: 16t + 2048i
        b = P.shared_addr(bar, 0)
        c, t = cuda.blockIdx.x, cuda.threadIdx.x
        if t == 0:
            P.mbarrier_init(b, 1)
            P.fence_mbarrier_init_cluster()
        cuda.syncthreads()
        P.cluster_arrive_relaxed()
        if t == 0:
            P.mbarrier_arrive_expect_tx(b, 4 * 8 * 128)
        P.cluster_wait()
        v = (x[c, t, 0], x[c, t, 1], x[c, t, 2], x[c, t, 3], x[c, t, 4], x[c, t, 5],
             x[c, t, 6], x[c, t, 7])
        at = P.shared_addr(s, 4 * t)
        SEND8(at, b, P.cluster_ctarank() ^ 1, v)
        P.mbarrier_wait_cluster(b, 0)
        w = ADD8(at, v)
        for i in range(8):
            out[c, t, i] = w[i]

    x = RNG.standard_normal((6, 128, 8)).astype(np.float32)
    out = kaionb.asarray(np.full(x.shape, np.nan, np.float32))
    exchange[exchange.signatures[0]]((6,), (128,), (kaionb.asarray(x), out), cluster=(2, 1, 1))
    peer = x.reshape(3, 2, 128, 8)[:, ::-1].reshape(x.shape)
    np.testing.assert_array_equal(out.get(), x + peer)


@gpu
@needs_gpu
@pytest.mark.skipif(not _is_sm90(), reason="mbarrier tx-count / bulk copy need sm_90")
def test_mbarrier_bulk_copy():
    @cuda.jit
    def k(src, out):
        bar = cuda.shared.array(1, types.uint64)
        s = cuda.shared.array(256, types.uint32, alignment=128)
        tid = cuda.threadIdx.x
        b = P.shared_addr(bar, 0)
        for i in range(tid, 256, 64):
            s[i] = POISON
        if tid == 0:
            P.mbarrier_init(b, 64)
        P.fence_proxy_async_shared()
        cuda.syncthreads()
        if tid == 0:
            P.mbarrier_arrive_expect_tx(b, 1024)
            P.cp_async_bulk_global_to_shared(P.shared_addr(s, 0), P.global_addr(src, 0), 1024, b)
        else:
            P.mbarrier_arrive(b)
        while P.mbarrier_try_wait_parity(b, 0) == 0:
            pass
        for i in range(tid, 256, 64):
            out[i] = s[i]

    src = RNG.integers(0, 2**32, 256, dtype=np.uint32)
    out = cuda.to_device(np.full(256, POISON, np.uint32))
    k[1, 64](cuda.to_device(src), out)
    np.testing.assert_array_equal(out.copy_to_host(), src)
