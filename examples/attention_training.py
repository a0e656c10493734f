"""A causal self-attention block trained on kaionb's tape, step for step beside the same block
in PyTorch (same initial weights, same data, same optimizer):

    q, k, v = x·Wq, x·Wk, x·Wv          kaionb.matmul        x [B, S, E] → [B, S, D]
    o       = attention(q, k, v)         kaionb.attention     causal; the batch as heads
    y       = o·Wo                       kaionb.matmul        [B, S, E]
    loss    = mean((y − target)²)                              target: a teacher block

The forward and backward of the block run on kaionb (``kaionb.grad.Tape``: matmul and
FlashAttention backward); the loss gradient and the Adam update run in torch on the same
memory (zero-copy through DLPack). First the tape's gradients for x and every weight are
checked against torch autograd, then both train for 200 steps; the loss curves must agree
step for step within 2% (kaionb's float32 attention computes on bf16 tensor cores, torch's
in float32), and are saved as a PNG.

    python examples/attention_training.py [--steps 200] [--png attention_training.png]
"""

import argparse
import json

from _primitive_demo import no_gpu_exit

no_gpu_exit()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kaionb  # noqa: E402
from kaionb.grad import Tape  # noqa: E402

B, S, E, D = 8, 128, 64, 64
NAMES = ("wq", "wk", "wv", "wo")


def torch_block(x, w):
    q, k, v = x @ w["wq"], x @ w["wk"], x @ w["wv"]
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o @ w["wo"]


def kaionb_block(x, w):
    q, k, v = (kaionb.matmul(x, w[n]) for n in ("wq", "wk", "wv"))
    return kaionb.matmul(kaionb.attention(q, k, v, causal=True), w["wo"])


def kaionb_step(x, weights, target):
    """Loss and gradients of the kaionb block: forward on the tape, dL/dy in torch, backward
    on the tape. The weights' .grad are float32 DeviceArrays."""
    for w in weights.values():
        w.grad = None
    with Tape() as tape:
        y = kaionb_block(x, weights)
    y_t = torch.from_dlpack(y)
    loss = torch.mean((y_t - target) ** 2)
    tape.backward(y, kaionb.asarray(2.0 * (y_t - target) / y_t.numel()))
    return float(loss)


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def save_plot(path, ours, theirs):
    try:
        import matplotlib
    except ImportError:
        from _png_plot import line_plot  # no matplotlib: a plain PNG, no text
        line_plot(path, [(theirs, (220, 60, 40)), (ours, (30, 90, 220))])
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(theirs, color="#dc3c28", lw=2.5, label="torch (float32)")
    ax.plot(ours, color="#1e5adc", lw=1.2, label="kaionb tape")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (MSE)")
    ax.set_yscale("log")
    ax.set_title("causal attention block, Adam: kaionb vs torch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--png", default="attention_training.png")
    parser.add_argument("--json")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=gen) * scale

    x = randn(B, S, E)
    teacher = {n: randn(E, D, scale=E ** -0.5) if n != "wo" else randn(D, E, scale=D ** -0.5)
               for n in NAMES}
    with torch.no_grad():
        target = torch_block(x, teacher)
    init = {n: randn(E, D, scale=E ** -0.5) if n != "wo" else randn(D, E, scale=D ** -0.5)
            for n in NAMES}

    # torch's block, and kaionb's on its own copies of the same weights.
    t_w = {n: w.clone().requires_grad_() for n, w in init.items()}
    k_w = {n: kaionb.asarray(w.clone()) for n, w in init.items()}
    for w in k_w.values():
        w.requires_grad = True
    k_views = {n: torch.from_dlpack(w) for n, w in k_w.items()}  # zero-copy, for Adam

    # 1. The tape's gradients against torch autograd (x included).
    x_t = x.clone().requires_grad_()
    loss_t = torch.mean((torch_block(x_t, t_w) - target) ** 2)
    ref = torch.autograd.grad(loss_t, [x_t, *t_w.values()])
    x_k = kaionb.asarray(x.clone())
    x_k.requires_grad = True
    loss_k = kaionb_step(x_k, k_w, target)
    print(f"step 0 loss: kaionb {loss_k:.6f}, torch {float(loss_t):.6f}")
    for name, ours, theirs in zip(("x", *NAMES), [x_k.grad, *(k_w[n].grad for n in NAMES)],
                                  ref):
        err = relative_error(torch.from_dlpack(ours), theirs)
        print(f"  d{name:3s} {tuple(theirs.shape)}: rel. error vs torch autograd {err:.1e}")
        assert err < 2e-2, name

    # 2. Train both: Adam on torch's weights and, through zero-copy views, on kaionb's.
    x_k = kaionb.asarray(x)
    opt_t = torch.optim.Adam(t_w.values(), lr=3e-3)
    opt_k = torch.optim.Adam(k_views.values(), lr=3e-3)
    ours, theirs = [], []
    for _ in range(args.steps):
        opt_t.zero_grad()
        loss_t = torch.mean((torch_block(x, t_w) - target) ** 2)
        loss_t.backward()
        opt_t.step()
        theirs.append(float(loss_t))
        ours.append(kaionb_step(x_k, k_w, target))
        for n in NAMES:
            k_views[n].grad = torch.from_dlpack(k_w[n].grad)
        opt_k.step()
    # Within 2% of torch's loss, or 0.1% of the first loss once both are that small
    # (then bf16's rounding of the attention output is most of what is left).
    gaps = np.abs(np.array(ours) - np.array(theirs)) / np.maximum(np.array(theirs),
                                                                   0.05 * theirs[0])
    print(f"{args.steps} steps: loss {ours[0]:.4f} → {ours[-1]:.5f} (kaionb), "
          f"{theirs[0]:.4f} → {theirs[-1]:.5f} (torch); largest step-for-step gap "
          f"{gaps.max():.2%} at step {int(gaps.argmax())}")
    save_plot(args.png, ours, theirs)
    print(f"loss curves: {args.png}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(kaionb=ours, torch=theirs), fh)
    assert gaps.max() < 0.02, "the loss curves drifted apart"


if __name__ == "__main__":
    main()
