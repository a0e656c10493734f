"""kaionb.ptx_patches: every instruction compiles, assembles and computes what the ISA says.

CPU part (runs in CI): each instruction is compiled inside a tiny kernel for sm_80, sm_89
and sm_90a (Hopper ones for sm_90a only), assembled by ptxas, and the PTX is checked to
contain the instruction. GPU part (marked ``gpu``): each instruction against a NumPy model
of its PTX-ISA semantics on random inputs, outputs poisoned first.
"""

import numpy as np
import pytest
from numba import cuda, types

import kaionb.ptx_patches as P
from kaionb._toolchain import CHECK_ARCHS, assemble

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
    x = P.ld_global_v4_f32(P.global_addr(f, 4))
    y = P.ld_global_nc_v4_f32(P.global_addr(f, 8))
    P.st_global_v4_u32(P.global_addr(u, 0), (a[0], b[1], a[2], b[3]))
    P.st_global_v4_f32(P.global_addr(f, 0), (x[0], y[1], x[2], y[3]))


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
    acc = P.wgmma_m64n64k16_f32_f16(u[0], u[1], 0, acc)
    acc = P.wgmma_m64n64k16_f32_bf16(u[0], u[1], 1, acc)
    P.wgmma_commit_group()
    P.wgmma_wait_group(0)
    for j in range(32):
        f[cuda.threadIdx.x * 32 + j] = acc[j]


def k_wgmma_n128(u, f):
    acc = P.accumulator_zeros(64)
    P.wgmma_fence()
    acc = P.wgmma_m64n128k16_f32_f16(u[0], u[1], 0, acc)
    acc = P.wgmma_m64n128k16_f32_bf16(u[0], u[1], 1, acc)
    P.wgmma_commit_group()
    P.wgmma_wait_group(0)
    for j in range(64):
        f[cuda.threadIdx.x * 64 + j] = acc[j]


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
    u[0] = P.make_smem_desc(P.shared_addr(s, 0), 1024, 128) >> 32


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
         "st.global.v4.u32", "st.global.v4.f32"],
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
    ptx, _ = cuda.compile_ptx(kernel, SIG, cc=cc)
    for text in expected:
        assert text in ptx, f"{text!r} missing from the PTX of {name}"
    assemble(ptx, CHECK_ARCHS[cc])


@pytest.mark.parametrize("cc", [(8, 0), (8, 9)])
@pytest.mark.parametrize("name", ["wgmma_n64", "mbarrier_bulk"])
def test_hopper_instruction_rejected_before_sm90(name, cc):
    kernel = CASES[name][0]
    with pytest.raises(P.ArchitectureError, match=r"needs sm_90.*compiled for sm_8"):
        cuda.compile_ptx(kernel, SIG, cc=cc)


def test_wgmma_error_names_instruction():
    with pytest.raises(P.ArchitectureError) as info:
        cuda.compile_ptx(k_wgmma, SIG, cc=(8, 9))
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
        cuda.compile_ptx(k, SIG, cc=(8, 0))
