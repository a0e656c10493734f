"""asv: attention forward (``kaionb.attention``: wgmma on an H100, mma.sync elsewhere) against
torch SDPA's FlashAttention-2 and cuDNN backends on the same bf16 inputs, at the shapes of
``benchmarks/attention_table.py``: prefill (full and causal, D = 64 and 128, GQA 32/8) and
one decode step (Sq = 1 against an 8192-key cache, GQA 32/8). kaionb writes into a
preallocated ``out``; GQA runs through ``enable_gqa`` (K/V not repeated)."""

from .common import batched_ms


class TimeAttention:
    params = (["b4h16s4096d128", "b4h16s4096d128-causal", "b4h32s4096d64",
               "b16h16s1024d128", "gqa32x8-s4096d128-causal",
               "decode-b16hq32hkv8-sk8192d128"],)
    param_names = ["shape"]
    timeout = 300

    # name: (B, Hq, Hkv, Sq, Sk, D, causal)
    SHAPES = {
        "b4h16s4096d128": (4, 16, 16, 4096, 4096, 128, False),
        "b4h16s4096d128-causal": (4, 16, 16, 4096, 4096, 128, True),
        "b4h32s4096d64": (4, 32, 32, 4096, 4096, 64, False),
        "b16h16s1024d128": (16, 16, 16, 1024, 1024, 128, False),
        "gqa32x8-s4096d128-causal": (4, 32, 8, 4096, 4096, 128, True),
        "decode-b16hq32hkv8-sk8192d128": (16, 32, 8, 1, 8192, 128, False),
    }

    def setup(self, shape):
        import kaionb

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        B, Hq, Hkv, Sq, Sk, D, causal = self.SHAPES[shape]
        self.torch, self.kaionb = torch, kaionb
        self.F, self.sdpa_kernel = F, sdpa_kernel
        self.fa2_backend, self.cudnn_backend = SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION
        self.causal, self.gqa = causal, Hq != Hkv
        self.decode = Sq <= 16
        if self.decode:  # bytes of K and V read once
            self.work = 2.0 * B * Hkv * Sk * D * 2
        else:  # FLOPs of Q·Kᵀ and P·V, half of them under a causal mask (Sq = Sk)
            self.work = 4.0 * B * Hq * Sq * Sk * D * (0.5 if causal else 1.0)
        self.q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=torch.bfloat16)
        self.k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16)
        self.v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.bfloat16)
        self.o = torch.empty_like(self.q)
        self.kq, self.kk, self.kv, self.ko = (kaionb.asarray(t)
                                              for t in (self.q, self.k, self.v, self.o))
        for _ in range(3):  # compile, load, warm up
            self._ours()
            self._fa2()
            self._cudnn()
        torch.cuda.synchronize()

    def _ours(self):
        return self.kaionb.attention(self.kq, self.kk, self.kv, causal=self.causal,
                                     out=self.ko)

    def _sdpa(self, backend):
        with self.sdpa_kernel([backend]):
            return self.F.scaled_dot_product_attention(self.q, self.k, self.v,
                                                       is_causal=self.causal,
                                                       enable_gqa=self.gqa)

    def _fa2(self):
        return self._sdpa(self.fa2_backend)

    def _cudnn(self):
        return self._sdpa(self.cudnn_backend)

    def time_kaionb(self, shape):
        self._ours()
        self.torch.cuda.synchronize()

    def track_rate(self, shape):
        """Prefill: TFLOP/s (4·B·Hq·Sq·Sk·D, halved for causal). Decode: GB/s of K and V
        (2·B·Hkv·Sk·D·2 bytes)."""
        ms = batched_ms(self._ours)
        return self.work / (ms * 1e-3) / (1e9 if self.decode else 1e12)

    track_rate.unit = "TFLOP/s (decode: GB/s)"

    def track_ratio_to_flash_attention_2(self, shape):
        """FlashAttention-2 time / ours: > 1 means kaionb is faster."""
        return batched_ms(self._fa2) / batched_ms(self._ours)

    track_ratio_to_flash_attention_2.unit = "ratio"

    def track_ratio_to_cudnn(self, shape):
        """torch SDPA's cuDNN backend time / ours: > 1 means kaionb is faster."""
        return batched_ms(self._cudnn) / batched_ms(self._ours)

    track_ratio_to_cudnn.unit = "ratio"


class TimeAttentionForwardBackward:
    """Forward + backward (``kaionb.attention`` with the lse, then ``kaionb.attention_bwd``,
    deterministic) against torch SDPA's FlashAttention-2 and cuDNN backends (forward, then
    ``torch.autograd.grad`` for dq, dk, dv), bf16, at the shapes of
    ``benchmarks/attention_bwd_table.py``. FLOPs: 3.5× the forward's."""

    params = (["b4h16s4096d128", "b4h16s4096d128-causal", "b4h32s4096d64",
               "b16h16s1024d128"],)
    param_names = ["shape"]
    timeout = 300
    SHAPES = {name: TimeAttention.SHAPES[name] for name in params[0]}

    def setup(self, shape):
        import kaionb

        if not kaionb.gpu_available():
            raise NotImplementedError("no CUDA GPU")
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        B, Hq, Hkv, Sq, Sk, D, causal = self.SHAPES[shape]
        self.torch, self.kaionb, self.causal = torch, kaionb, causal
        self.flops = 3.5 * 4.0 * B * Hq * Sq * Sk * D * (0.5 if causal else 1.0)
        opts = dict(device="cuda", dtype=torch.bfloat16)
        self.q = torch.randn(B, Hq, Sq, D, **opts, requires_grad=True)
        self.k = torch.randn(B, Hkv, Sk, D, **opts, requires_grad=True)
        self.v = torch.randn(B, Hkv, Sk, D, **opts, requires_grad=True)
        self.dout = torch.randn(B, Hq, Sq, D, **opts)
        self.kq, self.kk, self.kv, self.kdo = (kaionb.asarray(t.detach()) for t in
                                               (self.q, self.k, self.v, self.dout))
        self.ko = kaionb.empty(self.kq.shape, kaionb.bfloat16)
        self.grads = tuple(kaionb.empty(x.shape, kaionb.bfloat16)
                           for x in (self.kq, self.kk, self.kv))

        def sdpa(backend):
            def run():
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(self.q, self.k, self.v,
                                                         is_causal=causal)
                return torch.autograd.grad(out, (self.q, self.k, self.v), self.dout)
            return run

        self._fa2 = sdpa(SDPBackend.FLASH_ATTENTION)
        self._cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)
        for _ in range(2):  # compile, load, warm up
            self._ours()
            self._fa2()
            self._cudnn()
        torch.cuda.synchronize()

    def _ours(self):
        out, lse = self.kaionb.attention(self.kq, self.kk, self.kv, causal=self.causal,
                                         return_lse=True, out=self.ko)
        self.kaionb.attention_bwd(self.kdo, self.kq, self.kk, self.kv, out, lse,
                                  causal=self.causal, grads=self.grads)

    def time_kaionb(self, shape):
        self._ours()
        self.torch.cuda.synchronize()

    def track_rate(self, shape):
        """TFLOP/s of forward + backward (3.5 × 4·B·Hq·Sq·Sk·D, halved for causal)."""
        return self.flops / (batched_ms(self._ours, reps=5) * 1e-3) / 1e12

    track_rate.unit = "TFLOP/s"

    def track_ratio_to_flash_attention_2(self, shape):
        """FlashAttention-2 forward + backward time / ours: > 1 means kaionb is faster."""
        return batched_ms(self._fa2, reps=5) / batched_ms(self._ours, reps=5)

    track_ratio_to_flash_attention_2.unit = "ratio"

    def track_ratio_to_cudnn(self, shape):
        """cuDNN forward + backward time / ours: > 1 means kaionb is faster."""
        return batched_ms(self._cudnn, reps=5) / batched_ms(self._ours, reps=5)

    track_ratio_to_cudnn.unit = "ratio"
