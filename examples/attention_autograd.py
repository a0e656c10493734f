"""kaionb's attention inside PyTorch's autograd: a ``torch.autograd.Function`` whose forward
runs ``kaionb.attention`` (keeping the lse) and whose backward runs
``kaionb.attention_bwd`` — on the same memory, zero-copy through DLPack. The gradients are
checked against torch's own scaled_dot_product_attention, and repeated to show they are
bit-identical run to run.

    python examples/attention_autograd.py
"""

from _primitive_demo import no_gpu_exit

no_gpu_exit()

import torch  # noqa: E402

import kaionb  # noqa: E402


class KaionbAttention(torch.autograd.Function):
    """softmax(scale·Q·Kᵀ)·V on torch tensors [B, H, S, D] (f16/bf16, CUDA), GQA allowed."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None):
        q, k, v = (x.contiguous() for x in (q, k, v))
        out, lse = kaionb.attention(kaionb.asarray(q), kaionb.asarray(k), kaionb.asarray(v),
                                    causal=causal, scale=scale, return_lse=True)
        out_t, lse_t = torch.from_dlpack(out), torch.from_dlpack(lse)
        ctx.save_for_backward(q, k, v, out_t, lse_t)
        ctx.causal, ctx.scale = causal, scale
        return out_t

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = kaionb.attention_bwd(
            kaionb.asarray(grad_out.contiguous()), *(kaionb.asarray(x) for x in (q, k, v)),
            kaionb.asarray(out), kaionb.asarray(lse), causal=ctx.causal, scale=ctx.scale)
        return torch.from_dlpack(dq), torch.from_dlpack(dk), torch.from_dlpack(dv), None, None


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


if __name__ == "__main__":
    torch.manual_seed(0)
    B, HQ, HKV, S, D = 2, 8, 2, 1000, 128
    opts = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, HQ, S, D, **opts, requires_grad=True)
    k = torch.randn(B, HKV, S, D, **opts, requires_grad=True)
    v = torch.randn(B, HKV, S, D, **opts, requires_grad=True)
    dout = torch.randn(B, HQ, S, D, **opts)

    out = KaionbAttention.apply(q, k, v, True)
    ours = torch.autograd.grad(out, (q, k, v), dout)
    # torch's reference in float64 (math backend) on the same bf16 values.
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref_out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True,
                                                               enable_gqa=True)
    refs = torch.autograd.grad(ref_out, (q64, k64, v64), dout.double())
    print(f"B{B} GQA {HQ}/{HKV} S{S} D{D} causal, bf16: out rel. error "
          f"{relative_error(out, ref_out):.1e}")
    for name, g, r in zip(("dq", "dk", "dv"), ours, refs):
        print(f"  {name} {tuple(g.shape)} {g.dtype}: rel. error vs float64 "
              f"{relative_error(g, r):.1e}")
        assert relative_error(g, r) < 1e-2, name
    again = torch.autograd.grad(KaionbAttention.apply(q, k, v, True), (q, k, v), dout)
    same = all(torch.equal(a, b) for a, b in zip(ours, again))
    print(f"  repeated: bit-identical gradients: {same}")
    assert same
