"""adamw_step: bad input refused before launch and the launch plan (CPU, fake device
arrays); the NumPy reference against a textbook float64 loop (CPU); on a GPU, 100 steps
against the float64 reference and against torch.optim.AdamW, every grad dtype and half
copy, sizes off the vector width, misaligned views, and exact invariants."""

import numpy as np
import pytest

import kaionb
from kaionb.array import bfloat16
from kaionb.kernels import launch, optim
from kaionb.kernels.optim import adamw_ref, adamw_step
from kaionb.testing import assert_close, random_array, relative_error
from kaionb.testing import metadata_array as fake

gpu = pytest.mark.gpu

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
GRAD_DTYPES = [F32, F16, bfloat16]
COPY_DTYPES = [None, F16, bfloat16]
STEPS = 100
# Relative error (‖out − ref‖ / ‖ref‖) of param, m, v after STEPS steps, against float64
# and against torch. Measured on the CPU for these cases, param drifts the most: 1.2e-6
# (adamw_ref in float32 against float64), 1.8e-6 (torch's foreach arithmetic against
# adamw_ref in float32).
TOL = 1e-5
# Against torch: both sides carry their own float32 rounding over 100 steps (torch's fused
# kernel keeps beta and lr·wd in float64, its foreach path in float32). Measured on the
# H100: v differs by 1.23e-5 from the fused kernel while each is within 1e-5 of float64.
TOL_TORCH = 3e-5
# torch.optim.AdamW's defaults, and a set with every hyper-parameter moved.
HYPER = {
    "default": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01),
    "custom": dict(lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1),
}


def _name(d):
    return "none" if d is None else np.dtype(d).name


# ----------------------------------------------------------------------------- CPU

@pytest.fixture
def launches(monkeypatch):
    """Launches are recorded instead of run: (kernel name, grid, block, args)."""
    calls = []

    def compiled(kdef, signature):
        def launch_it(grid, block, args, shared_mem=0):
            calls.append((kdef.name, grid, block, args))
        return launch_it

    monkeypatch.setattr(launch.KernelDef, "__getitem__", compiled)
    return calls


def _arrays(shape=(4, 8), grad=F32, copy=None):
    out = dict(param=fake(shape), grad=fake(shape, grad), m=fake(shape), v=fake(shape))
    if copy is not None:
        out["model_param"] = fake(shape, copy)
    return out


def _call(**changes):
    kw = dict(_arrays(copy=F16), lr=1e-3, step=1)
    kw.update(changes)
    return adamw_step(kw.pop("param"), kw.pop("grad"), kw.pop("m"), kw.pop("v"), **kw)


def _overlapping():
    base = fake((64,))
    return dict(param=base._view((4, 8), (32, 4)), v=base._view((4, 8), (32, 4), 64))


BAD = [
    # (changes to a valid call, error type, message pattern)
    (dict(param=fake((4, 8), F16)), TypeError, r"'param' expected dtype float32, got float16"),
    (dict(m=fake((4, 8), np.float64)), TypeError, r"'m' expected dtype float32"),
    (dict(v=fake((4, 8), bfloat16)), TypeError, r"'v' expected dtype float32"),
    (dict(grad=fake((4, 8), np.int8)), TypeError,
     r"'grad' expected dtype float32 or float16 or bfloat16, got int8"),
    (dict(model_param=fake((4, 8))), TypeError,
     r"'model_param' expected dtype float16 or bfloat16, got float32"),
    (dict(grad=None), TypeError, r"'grad' expected an array, got None"),
    (dict(param=np.zeros((4, 8), np.float32)), TypeError, r"'param' expected device memory"),
    (dict(v=np.zeros((4, 8), np.float32)), TypeError, r"'v' expected device memory"),
    (dict(model_param=np.zeros((4, 8), np.float16)), TypeError,
     r"'model_param' expected device memory"),
    (dict(grad=fake((4, 9))), ValueError, r"'grad' expected shape \(4, 8\), got \(4, 9\)"),
    (dict(m=fake((32,))), ValueError, r"'m' expected shape \(4, 8\), got \(32,\)"),
    (dict(model_param=fake((8, 4), F16)), ValueError, r"'model_param' expected shape \(4, 8\)"),
    (dict(param=fake((8, 4)).T), ValueError, r"'param' expected a C-contiguous array"),
    (dict(grad=fake((4, 16))[:, ::2]), ValueError, r"'grad' expected a C-contiguous array"),
    (dict(v=fake((4, 8), device_id=1)), ValueError, r"'v' expected device 0"),
    (dict(step=0), ValueError, r"'step' expected an int >= 1"),
    (dict(step=-3), ValueError, r"'step' expected an int >= 1"),
    (dict(step=1.0), TypeError, r"'step' expected an int >= 1 .*, got float"),
    (dict(step=True), TypeError, r"'step' expected an int >= 1 .*, got bool"),
    (dict(lr=-1e-3), ValueError, r"'lr' expected a finite value >= 0, got -0.001"),
    (dict(lr=float("nan")), ValueError, r"'lr' expected a finite value >= 0"),
    (dict(lr="1e-3"), TypeError, r"'lr' expected a real number, got str"),
    (dict(beta1=1.0), ValueError, r"'beta1' expected a finite value in \[0, 1\), got 1.0"),
    (dict(beta1=-0.1), ValueError, r"'beta1' expected a finite value in \[0, 1\)"),
    (dict(beta2=float("inf")), ValueError, r"'beta2' expected a finite value in \[0, 1\)"),
    (dict(eps=0.0), ValueError, r"'eps' expected a finite value > 0, got 0.0"),
    (dict(eps=-1e-8), ValueError, r"'eps' expected a finite value > 0"),
    (dict(weight_decay=-0.01), ValueError, r"'weight_decay' expected a finite value >= 0"),
    (dict(weight_decay=float("inf")), ValueError, r"'weight_decay' expected a finite"),
    (dict(maximize="yes"), TypeError, r"'maximize' expected a bool, got str"),
    (_overlapping(), ValueError, r"'v' expected memory apart from 'param'"),
]


@pytest.mark.parametrize("changes, exc, pattern", BAD, ids=[
    f"{'-'.join(c)}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_bad_input_refused_before_launch(launches, changes, exc, pattern):
    with pytest.raises(exc, match="^adamw_step: argument " + pattern):
        _call(**changes)
    assert not launches


@pytest.mark.parametrize("name", ["grad", "m", "v", "model_param"])
def test_aliasing_refused(launches, name):
    a = _arrays(copy=F16)
    # The same array again, or (model_param) the first half of param's bytes as halves.
    a[name] = a["param"] if name != "model_param" else a["param"]._view((4, 8), (16, 2),
                                                                        dtype=F16)
    with pytest.raises(ValueError, match=f"argument '{name}' expected memory apart from "
                                         "'param'"):
        adamw_step(**a, lr=1e-3, step=1)
    assert not launches


def test_empty_arrays_launch_nothing(launches):
    assert adamw_step(**_arrays((0, 8), copy=bfloat16), lr=1e-3, step=1) is None
    assert not launches


def test_valid_calls_launch_one_kernel_each(launches):
    a = _arrays((3, 5), grad=bfloat16, copy=F16)
    for step in (2, 3):  # the second call takes the cached plan
        assert adamw_step(**a, lr=2e-3, beta1=0.5, beta2=0.75, eps=1e-6, weight_decay=0.1,
                          step=step, maximize=True) is None
    (name, grid, block, args), (name3, grid3, block3, args3) = launches
    assert name == name3 == "_adamw_step_fwd_kernel_bfloat16_float16"
    assert grid == grid3 == (1,) and block == block3 == (256,)
    # Flat views of the five arrays, n, aligned, then the scalars rounded to float32.
    assert [(x.ptr, x.shape, x.dtype) for x in args[:5]] == [
        (x.ptr, (15,), x.dtype) for x in a.values()]
    assert args[5:7] == (15, 1)
    f32 = [float(np.float32(x)) for x in (-1.0, 2e-4, 0.5, 0.25, 2e-3 / 0.75,
                                             0.4375 ** 0.5, 1e-6)]
    assert args[7:] == tuple(f32)
    assert args3[11] == float(np.float32(2e-3 / (1 - 0.5 ** 3)))  # step 3's step size


def test_without_copy_the_kernel_gets_param_twice(launches):
    a = _arrays((64, 64))
    adamw_step(**a, lr=1e-3, step=1)
    ((name, grid, _, args),) = launches
    assert name == "_adamw_step_fwd_kernel_float32" and grid == (2,)
    assert args[4].ptr == a["param"].ptr and args[4].shape == (64 * 64,)


@pytest.mark.parametrize("n, grid", [(1, 1), (7, 1), (8, 1), (2048, 1), (2049, 1),
                                     (2056, 2), (4099, 2), ((1 << 20) + 3, 512)])
def test_plan_aligned(n, grid):
    a = _arrays((n,), grad=F16, copy=bfloat16)
    assert optim._adamw_plan(*a.values()) == (optim._KERNELS[F16, bfloat16], (grid,), 1)


@pytest.mark.parametrize("name", ["param", "grad", "m", "v", "model_param"])
def test_plan_misaligned_goes_elementwise(name):
    a = _arrays((1000,), copy=F16)
    a[name] = fake((1001,), a[name].dtype)[1:]  # one element off 16-byte alignment
    assert optim._adamw_plan(*a.values())[1:] == ((4,), 0)


def _textbook(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, step, maximize=False):
    """torch.optim.AdamW's single-tensor loop, in float64."""
    g = -g if maximize else g
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - beta2 ** step) + eps
    return p - lr / (1 - beta1 ** step) * m / denom, m, v


@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("hyper", list(HYPER))
def test_reference_over_100_steps(hyper, maximize):
    rng = np.random.default_rng(5)
    n = 4099
    p0 = random_array((n,), rng=rng)
    ref64 = ref32 = book = (p0, np.zeros(n, np.float32), np.zeros(n, np.float32))
    for step in range(1, STEPS + 1):
        g = random_array((n,), rng=rng, scale=0.1)
        kw = dict(HYPER[hyper], step=step, maximize=maximize)
        book = _textbook(*(np.asarray(x, np.float64) for x in (book[0], g, *book[1:])), **kw)
        ref64 = adamw_ref(ref64[0], g, *ref64[1:], **kw)
        ref32 = adamw_ref(ref32[0], g, *ref32[1:], dtype=np.float32, **kw)
    assert all(x.dtype == np.float32 for x in ref32)
    for name, r64, r32, b in zip(("param", "m", "v"), ref64, ref32, book):
        assert relative_error(r64, b) < 1e-12, name
        assert_close(r32, b, tol=TOL, what=name)
    assert relative_error(ref64[0], p0) > 1e-3  # the steps moved the parameters


# ----------------------------------------------------------------------------- GPU

def _run(shape, grad_dtype, copy_dtype, hyper, *, steps=STEPS, seed=0, view=None):
    """``steps`` calls of adamw_step on fresh gradients (scale 0.1) beside adamw_ref in
    float64; checks param, m, v and the half copy. ``view(name, host)`` may turn an
    array into a device view of its own choosing."""
    rng = np.random.default_rng(seed)
    view = view or (lambda name, host: kaionb.asarray(host))
    p0 = random_array(shape, rng=rng)
    zeros = np.zeros(shape, np.float32)
    p, m, v = view("param", p0), view("m", zeros), view("v", zeros)
    copy = None  # poisoned: every element must be written
    if copy_dtype is not None:
        copy = view("model_param", np.full(shape, np.nan, copy_dtype))
    ref = (p0, zeros, zeros)
    for step in range(1, steps + 1):
        g = random_array(shape, grad_dtype, rng=rng, scale=0.1)
        assert adamw_step(p, view("grad", g), m, v, step=step, model_param=copy,
                          **HYPER[hyper]) is None
        ref = adamw_ref(ref[0], g, *ref[1:], step=step, **HYPER[hyper])
    got = [x.get() for x in (p, m, v)]
    for name, out, r in zip(("param", "m", "v"), got, ref):
        assert out.shape == tuple(shape) and out.dtype == np.float32
        assert_close(out, r, tol=TOL, what=name)
    if copy is not None:
        # The copy is the final float32 param rounded to nearest even: bit for bit.
        np.testing.assert_array_equal(copy.get().view(np.uint16),
                                      got[0].astype(copy_dtype).view(np.uint16))
    return got


SHAPES = [(1,), (7,), (1000,), (4099,), (37, 129)]


@gpu
@pytest.mark.parametrize("copy_dtype", COPY_DTYPES, ids=_name)
@pytest.mark.parametrize("grad_dtype", GRAD_DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_adamw_step(shape, grad_dtype, copy_dtype):
    _run(shape, grad_dtype, copy_dtype, "custom", seed=sum(shape))


@gpu
@pytest.mark.parametrize("grad_dtype, copy_dtype", [(F32, None), (F16, F16),
                                                    (bfloat16, bfloat16)], ids=_name)
def test_adamw_step_large(grad_dtype, copy_dtype):
    _run(((1 << 20) + 3,), grad_dtype, copy_dtype, "default", seed=1)


@gpu
@pytest.mark.parametrize("name", ["param", "grad", "m", "v", "model_param"])
def test_misaligned_view(name):
    # One array starts 1 element past an allocation (off 16-byte alignment): the kernel
    # goes element by element, with the same results.
    def view(which, host):
        if which != name:
            return kaionb.asarray(host)
        padded = np.concatenate([host[:1], host])
        return kaionb.asarray(padded)[1:]

    _run((1000,), bfloat16, F16, "custom", steps=10, view=view, seed=7)


@gpu
def test_maximize_is_the_negated_gradient():
    rng = np.random.default_rng(3)
    p0, g = random_array((4099,), rng=rng), random_array((4099,), rng=rng)
    results = []
    for grad, maximize in ((g, True), (-g, False)):
        p, m, v = kaionb.asarray(p0), kaionb.zeros(p0.shape, np.float32), kaionb.zeros(
            p0.shape, np.float32)
        for step in (1, 2, 3):
            adamw_step(p, kaionb.asarray(grad), m, v, lr=1e-2, step=step, maximize=maximize)
        results.append([x.get() for x in (p, m, v)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@gpu
def test_zero_lr_keeps_param():
    rng = np.random.default_rng(4)
    p0 = random_array((1000,), rng=rng)
    p, m, v = kaionb.asarray(p0), kaionb.zeros((1000,), np.float32), kaionb.zeros(
        (1000,), np.float32)
    adamw_step(p, kaionb.asarray(random_array((1000,), rng=rng)), m, v, lr=0.0, step=1,
               weight_decay=0.5)
    np.testing.assert_array_equal(p.get(), p0)
    assert np.all(v.get() > 0)


@gpu
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("grad_dtype", [F32, bfloat16], ids=_name)
@pytest.mark.parametrize("hyper", list(HYPER))
def test_matches_torch(hyper, grad_dtype, fused):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    h = HYPER[hyper]
    shape = (64, 1000 + 3)
    rng = np.random.default_rng(11)
    p0 = random_array(shape, rng=rng)
    tp = torch.tensor(p0, device="cuda", requires_grad=True)
    options = dict(lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                   weight_decay=h["weight_decay"])
    try:
        opt = torch.optim.AdamW([tp], fused=True, **options) if fused else \
            torch.optim.AdamW([tp], foreach=True, **options)
    except (TypeError, RuntimeError) as exc:  # an older torch without fused AdamW
        pytest.skip(f"torch.optim.AdamW(fused={fused}): {exc}")
    p, m, v = kaionb.asarray(p0), kaionb.zeros(shape, np.float32), kaionb.zeros(
        shape, np.float32)
    for step in range(1, STEPS + 1):
        g = random_array(shape, grad_dtype, rng=rng, scale=0.1)
        tp.grad = torch.tensor(g.astype(np.float32), device="cuda")
        opt.step()
        adamw_step(p, kaionb.asarray(g), m, v, step=step, **h)
    state = opt.state[tp]
    torch.cuda.synchronize()
    for name, ours, theirs in (("param", p, tp.detach()), ("m", m, state["exp_avg"]),
                               ("v", v, state["exp_avg_sq"])):
        assert_close(ours, theirs.cpu().numpy().astype(np.float64), tol=TOL_TORCH,
                     what=f"{name} vs torch")


@gpu
def test_updates_torch_tensors_in_place():
    # PyTorch tensors go in zero-copy (DLPack): the update lands in their memory.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    rng = np.random.default_rng(13)
    shape = (33, 257)
    p0, g = random_array(shape, rng=rng), random_array(shape, rng=rng, scale=0.1)
    tp, tg = torch.tensor(p0, device="cuda"), torch.tensor(g, device="cuda").bfloat16()
    tm, tv = torch.zeros_like(tp), torch.zeros_like(tp)
    tw = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    for step in (1, 2):
        adamw_step(tp, tg, tm, tv, lr=1e-2, step=step, model_param=tw)
    kaionb.current_stream().synchronize()
    g16 = tg.float().cpu().numpy()
    ref = (p0, np.zeros(shape), np.zeros(shape))
    for step in (1, 2):
        ref = adamw_ref(ref[0], g16, *ref[1:], lr=1e-2, step=step)
    for name, ours, r in zip(("param", "m", "v"), (tp, tm, tv), ref):
        assert_close(ours.cpu().numpy(), r, tol=TOL, what=name)
    assert torch.equal(tw, tp.bfloat16())
