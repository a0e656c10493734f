"""attention: bad input refused before launch (CPU, on metadata arrays); the float64
reference checked against a loop (CPU); on a GPU every path — prefill (the wgmma kernel
on an H100 for D 64/128/256, the mma.sync kernel otherwise and forced), packed GQA, key
splits + combine (decode), causal with Sq < Sk and Sq > Sk, odd S and D, strided views,
f32 inputs, KAIO's entries — against float64 with poisoned outputs, lse included."""

import math

import numpy as np
import pytest

import kaionb
from kaionb.kernels import attention as at
from kaionb.testing import assert_close, poisoned, random_array
from kaionb.testing import metadata_array as fake

gpu = pytest.mark.gpu
F16, BF16, F32 = np.dtype(np.float16), kaionb.bfloat16, np.dtype(np.float32)
# Relative error ‖out − ref‖/‖ref‖ against float64 on the (rounded) inputs: P is rounded
# to the input type before P·V, and the output once more.
TOL = {F16: 2e-3, BF16: 1e-2, F32: 1e-2}
LSE_TOL = 1e-4  # relative, f32 softmax statistics with ex2.approx


# -- bad input (CPU) ---------------------------------------------------------------------------

def _qkv(q=(2, 8, 33, 64), k=(2, 2, 40, 64), v=None, dtype=F16, **kw):
    return fake(q, dtype), fake(k, kw.get("kdtype", dtype)), fake(v or k, kw.get("vdtype", dtype))


BAD = [
    # (description, kwargs for _qkv, attention kwargs, exception, message fragment)
    ("integer q", dict(dtype=np.int8), {}, TypeError, "argument 'q' expected dtype"),
    ("mixed dtypes", dict(kdtype=BF16), {}, TypeError, "argument 'k' expected the dtype of 'q'"),
    ("v dtype", dict(vdtype=F32), {}, TypeError, "argument 'v' expected the dtype of 'q'"),
    ("rank 5", dict(q=(1, 2, 8, 33, 64), k=(1, 2, 2, 40, 64)), {}, ValueError,
     "argument 'q' expected 2 to 4 dimensions"),
    ("rank 1", dict(q=(64,), k=(64,)), {}, ValueError, "argument 'q' expected 2 to 4"),
    ("ranks differ", dict(k=(2, 40, 64)), {}, ValueError, "argument 'k' expected 4 dimensions"),
    ("k vs v", dict(v=(2, 2, 41, 64)), {}, ValueError, "argument 'v' expected the shape of 'k'"),
    ("head dims", dict(k=(2, 2, 40, 72)), {}, ValueError,
     "argument 'k' expected head dimension 64"),
    ("D not x8", dict(q=(2, 8, 33, 60), k=(2, 2, 40, 60)), {}, ValueError,
     "argument 'q' expected a head dimension (last axis) that is a multiple of 8 from 8 to "
     "256, got 60"),
    ("D too big", dict(q=(2, 8, 33, 264), k=(2, 2, 40, 264)), {}, ValueError,
     "argument 'q' expected a head dimension (last axis) that is a multiple of 8 from 8 to "
     "256, got 264"),
    ("batch", dict(k=(3, 2, 40, 64)), {}, ValueError, "argument 'k' expected batch 2"),
    ("GQA", dict(k=(2, 3, 40, 64)), {}, ValueError,
     "argument 'k' expected a number of heads that divides q's 8 (GQA), got 3"),
    ("scale nan", {}, dict(scale=float("nan")), ValueError, "argument 'scale' expected a finite"),
    ("scale < 0", {}, dict(scale=-1.0), ValueError, "argument 'scale' expected a finite value > 0"),
    ("scale str", {}, dict(scale="1"), TypeError, "argument 'scale' expected a float"),
    ("out shape", {}, dict(out=fake((2, 8, 33, 65), F16)), ValueError,
     "argument 'out' expected shape (2, 8, 33, 64)"),
    ("out dtype", {}, dict(out=fake((2, 8, 33, 64), F32)), TypeError,
     "argument 'out' expected dtype float16"),
    ("out host", {}, dict(out=np.zeros((2, 8, 33, 64), np.float16)), TypeError,
     "argument 'out' expected device memory"),
]


@pytest.mark.parametrize("what, shapes, kwargs, exc, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_refused(what, shapes, kwargs, exc, message):
    q, k, v = _qkv(**shapes)
    with pytest.raises(exc, match="attention: " + _escape(message)):
        kaionb.attention(q, k, v, **kwargs)


def test_strided_last_axis_refused():
    q = fake((2, 8, 33, 128), F16)
    view = q._view((2, 8, 33, 64), (q.strides[0], q.strides[1], q.strides[2], 4))
    k = fake((2, 2, 40, 64), F16)
    with pytest.raises(ValueError, match="argument 'q' expected a contiguous last axis"):
        kaionb.attention(view, k, k)


def test_misaligned_out_refused():
    # Contiguous last axis, but rows 8 bytes off a 16-byte boundary: the kernels store
    # 16 bytes at a time.
    q, k, v = _qkv()
    wide = fake((2, 8, 33, 72), F16)
    out = wide._view((2, 8, 33, 64), wide.strides, offset_bytes=8)
    with pytest.raises(ValueError, match="attention: argument 'out' expected 16-byte aligned"):
        kaionb.attention(q, k, v, out=out)


def test_none_refused():
    k = fake((2, 2, 40, 64), F16)
    with pytest.raises(TypeError, match="attention: argument 'q' expected an array, got None"):
        kaionb.attention(None, k, k)


@pytest.mark.parametrize("entry", [kaionb.attention_tc, kaionb.attention_tc_causal,
                                   kaionb.attention_flash, kaionb.attention_flash_causal])
def test_kaio_entries_take_one_head(entry):
    q = fake((2, 16, 64), F16)
    with pytest.raises(ValueError, match=f"{entry.__name__}: argument 'q' expected 2 "
                                         "dimensions"):
        entry(q, q, q)
    x = fake((16, 64), np.int32)
    with pytest.raises(TypeError, match=f"{entry.__name__}: argument 'q' expected dtype"):
        entry(x, x, x)


def _escape(text):
    import re
    return re.escape(text)


# -- the reference (CPU) -----------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk", [(5, 9), (9, 5), (7, 7)])
def test_reference_against_a_loop(causal, sq, sk):
    rng = np.random.default_rng(sq * 10 + sk)
    q = rng.standard_normal((2, 4, sq, 8))
    k = rng.standard_normal((2, 2, sk, 8))
    v = rng.standard_normal((2, 2, sk, 8))
    out, lse = at.attention_ref(q, k, v, causal=causal, scale=0.7)
    for b in range(2):
        for h in range(4):
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
                if not keys:
                    assert (out[b, h, i] == 0).all() and lse[b, h, i] == -np.inf
                    continue
                s = np.array([0.7 * q[b, h, i] @ k[b, h // 2, j] for j in keys])
                w = np.exp(s - s.max())
                np.testing.assert_allclose(out[b, h, i], w @ v[b, h // 2, keys] / w.sum(),
                                           rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(lse[b, h, i], s.max() + np.log(w.sum()), rtol=1e-12)


def test_every_head_dim_has_a_kernel():
    for D in range(8, at.MAX_HEAD_DIM + 1, 8):
        dp = at._head_dim_class(D)
        assert dp >= D and dp % 16 == 0
        for operand in ("f16", "bf16"):
            for tile in at.TILES:
                assert (operand, dp, tile) in at._KERNELS


# -- GPU ---------------------------------------------------------------------------------------

def check_attention(B, Hq, Hkv, Sq, Sk, D, dtype, *, causal=False, scale=None, seed=0,
                    logit_scale=1.0, rank=4):
    """One call against float64 with a poisoned out= and the lse; returns (out, lse)."""
    rng = np.random.default_rng(seed)
    lead = {4: (B, Hq), 3: (Hq,), 2: ()}[rank]
    klead = {4: (B, Hkv), 3: (Hkv,), 2: ()}[rank]
    q = random_array(lead + (Sq, D), dtype, rng=rng, scale=logit_scale)
    k = random_array(klead + (Sk, D), dtype, rng=rng, scale=logit_scale)
    v = random_array(klead + (Sk, D), dtype, rng=rng)
    out = poisoned(q.shape, dtype)
    got, lse = kaionb.attention(kaionb.asarray(q), kaionb.asarray(k), kaionb.asarray(v),
                                causal=causal, scale=scale, return_lse=True, out=out)
    assert got is out
    ref, ref_lse = at.attention_ref(q, k, v, causal=causal, scale=scale)
    assert_close(out, ref, tol=TOL[np.dtype(dtype)], what="out")
    assert_close(lse, ref_lse, tol=LSE_TOL, what="lse")
    return out, lse


SHAPES = [
    # B, Hq, Hkv, Sq, Sk, D
    (1, 1, 1, 1, 1, 64),
    (2, 4, 4, 17, 17, 64),
    (1, 2, 2, 127, 127, 128),
    (1, 2, 1, 1000, 1000, 128),      # GQA 2, odd length
    (1, 1, 1, 4099, 4099, 64),       # long, past every tile multiple
    (2, 8, 2, 100, 333, 80),         # GQA 4, Sq < Sk, D not a power of two
    (1, 8, 1, 333, 100, 8),          # MQA 8, Sq > Sk, D = 8
    (1, 2, 2, 130, 257, 256),        # widest head, Q from shared memory
    (1, 4, 2, 65, 200, 192),
    (1, 2, 2, 40, 50, 32),
    (1, 2, 2, 40, 50, 96),
]


@gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention(shape, causal, dtype):
    check_attention(*shape, dtype, causal=causal, seed=sum(shape))


DECODE = [
    # B, Hq, Hkv, Sq, Sk, D: the decode tile (G·Sq ≤ 16), keys split, splits merged
    (4, 32, 8, 1, 8192, 128),
    (2, 8, 1, 2, 3001, 128),
    (3, 4, 4, 16, 1500, 64),
    (1, 16, 2, 1, 70, 256),
    (2, 4, 1, 3, 999, 80),
]


@gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s)))
def test_attention_decode(shape, causal, dtype):
    check_attention(*shape, dtype, causal=causal, seed=sum(shape) + 1)


MMA_SYNC_ON_HOPPER = [(2, 4, 2, 300, 333, 128), (1, 2, 2, 129, 200, 64), (1, 2, 1, 70, 90, 256)]


@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", MMA_SYNC_ON_HOPPER, ids=lambda s: "x".join(map(str, s)))
def test_mma_sync_kernel_where_wgmma_would_run(shape, causal):
    # The head dimensions the Hopper kernel takes, through the mma.sync kernel (on an
    # H100 the dispatcher would pick wgmma; elsewhere this is the default path anyway).
    B, Hq, Hkv, Sq, Sk, D = shape
    rng = np.random.default_rng(sum(shape))
    q = random_array((B, Hq, Sq, D), BF16, rng=rng)
    k = random_array((B, Hkv, Sk, D), BF16, rng=rng)
    v = random_array((B, Hkv, Sk, D), BF16, rng=rng)
    out = poisoned(q.shape, BF16)
    _, lse = at.attention_fwd(kaionb.asarray(q), kaionb.asarray(k), kaionb.asarray(v), causal,
                              None, True, out=out, prefer_wgmma=False)
    ref, ref_lse = at.attention_ref(q, k, v, causal=causal)
    assert_close(out, ref, tol=TOL[BF16])
    assert_close(lse, ref_lse, tol=LSE_TOL)


@gpu
@pytest.mark.parametrize("rank", [2, 3])
def test_lower_ranks(rank):
    check_attention(1, 4, 2 if rank == 3 else 4, 77, 90, 64, F16, causal=True, rank=rank,
                    seed=rank)


@gpu
def test_large_logits_do_not_overflow():
    # scale·q·k around ±50: exp would overflow float16 without the running maximum.
    out, lse = check_attention(1, 2, 2, 200, 300, 64, F16, logit_scale=3.0, scale=0.7, seed=5)
    assert np.isfinite(out.get().astype(np.float64)).all()
    assert np.abs(lse.get()).max() > 30


@gpu
def test_rows_without_keys():
    # Causal with Sq > Sk: the first Sq − Sk queries see no key: zeros and lse −inf.
    out, lse = check_attention(1, 2, 2, 150, 40, 64, BF16, causal=True, seed=9)
    assert (out.get()[:, :, :110].astype(np.float64) == 0).all()
    assert (lse.get()[:, :, :110] == -np.inf).all()
    assert np.isfinite(lse.get()[:, :, 110:]).all()


@gpu
def test_no_keys_at_all():
    q = kaionb.asarray(random_array((1, 2, 5, 64), F16))
    kv = kaionb.empty((1, 2, 0, 64), F16)
    out, lse = kaionb.attention(q, kv, kv, return_lse=True)
    assert (out.get().astype(np.float64) == 0).all() and (lse.get() == -np.inf).all()


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_bshd_views_without_copy(causal):
    # [B, S, H, D] memory (as most models store it) passed as transposed views.
    rng = np.random.default_rng(3)
    q = random_array((2, 300, 8, 64), BF16, rng=rng)
    k = random_array((2, 310, 2, 64), BF16, rng=rng)
    v = random_array((2, 310, 2, 64), BF16, rng=rng)
    qd, kd, vd = (kaionb.asarray(x).transpose(0, 2, 1, 3) for x in (q, k, v))
    out = kaionb.asarray(np.full((2, 300, 8, 64), np.nan, BF16)).transpose(0, 2, 1, 3)
    kaionb.attention(qd, kd, vd, causal=causal, out=out)
    ref, _ = at.attention_ref(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                              v.transpose(0, 2, 1, 3), causal=causal)
    assert_close(out, ref, tol=TOL[BF16])


@gpu
def test_float32_inputs():
    rng = np.random.default_rng(4)
    q, k, v = (random_array((1, 4, 129, 64), F32, rng=rng) for _ in range(3))
    out = kaionb.attention(kaionb.asarray(q), kaionb.asarray(k), kaionb.asarray(v), causal=True)
    assert out.dtype == F32
    assert_close(out, at.attention_ref(q, k, v, causal=True)[0], tol=TOL[F32])


@gpu
def test_misaligned_inputs_are_copied():
    rng = np.random.default_rng(6)
    wide = kaionb.asarray(random_array((3, 70, 72), F16, rng=rng))
    q = wide[:, :, 1:65]  # 2-byte offset: cp.async needs 16
    out = kaionb.attention(q, q, q)
    ref, _ = at.attention_ref(q.get(), q.get(), q.get())
    assert_close(out, ref, tol=TOL[F16])


@gpu
def test_kaio_entries():
    rng = np.random.default_rng(7)
    q, k, v = (random_array((100, 64), F16, rng=rng) for _ in range(3))
    qd, kd, vd = (kaionb.asarray(x) for x in (q, k, v))
    for entry, causal in ((kaionb.attention_tc, False), (kaionb.attention_tc_causal, True)):
        out = entry(qd, kd, vd)
        assert out.dtype == F32 and out.shape == (100, 64)
        assert_close(out, at.attention_ref(q, k, v, causal=causal)[0], tol=TOL[F16])
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    for entry, causal in ((kaionb.attention_flash, False), (kaionb.attention_flash_causal, True)):
        out, lse = entry(kaionb.asarray(q32), kaionb.asarray(k32), kaionb.asarray(v32),
                         with_stats=True)
        ref, ref_lse = at.attention_ref(q32, k32, v32, causal=causal)
        assert out.dtype == F32 and lse.shape == (100,)
        assert_close(out, ref, tol=TOL[F32])
        assert_close(lse, ref_lse, tol=1e-3)


@gpu
@pytest.mark.parametrize("shape", [(2, 8, 2, 500, 700, 128), (4, 32, 8, 1, 8192, 128)],
                         ids=["prefill", "decode"])
def test_bit_identical_repeats(shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    rng = np.random.default_rng(8)
    q = kaionb.asarray(random_array((B, Hq, Sq, D), BF16, rng=rng))
    k = kaionb.asarray(random_array((B, Hkv, Sk, D), BF16, rng=rng))
    v = kaionb.asarray(random_array((B, Hkv, Sk, D), BF16, rng=rng))
    first = kaionb.attention(q, k, v, causal=True).get().view(np.uint16)
    for _ in range(5):
        assert np.array_equal(kaionb.attention(q, k, v, causal=True).get().view(np.uint16),
                              first)


@gpu
def test_context_usable_after_bad_input():
    q = kaionb.asarray(random_array((1, 4, 33, 64), F16))
    k = kaionb.asarray(random_array((1, 3, 40, 64), F16))
    with pytest.raises(ValueError):
        kaionb.attention(q, k, k)
    check_attention(1, 4, 2, 33, 40, 64, F16, seed=11)


@gpu
def test_scale_default_is_inverse_sqrt_d():
    rng = np.random.default_rng(12)
    q, k, v = (kaionb.asarray(random_array((1, 2, 50, 128), F16, rng=rng)) for _ in range(3))
    a = kaionb.attention(q, k, v).get()
    b = kaionb.attention(q, k, v, scale=1.0 / math.sqrt(128)).get()
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
