"""The shapes and dtypes every row-wise op (norms, softmax, activations, INT8
quantization) is checked on: the row widths and row counts of issue 4, each dtype."""

import numpy as np

from kaionb.array import bfloat16

DTYPES = [np.float32, np.float16, bfloat16]
WIDTHS = [1, 7, 33, 1000, 4096, 8191, 65537, 262144]
ROWS = [1, 3, 16384]
MAX_ELEMENTS = 1 << 23  # float64 references stay small (16384-row cases: widths ≤ 33)
CASES = [(r, n) for r in ROWS for n in WIDTHS if r * n <= MAX_ELEMENTS]



def cluster_width(dtype, size, op="rms_norm"):
    """A row width (a multiple of the vector width) that the forward row kernel of ``op``
    (rms_norm, layer_norm, add_rms_norm or softmax) spreads over a cluster of ``size``
    CTAs on sm_90 (float32): more than one CTA and than half as many cluster CTAs hold,
    so the last CTA's run is short."""
    from kaionb.kernels import norms
    from kaionb.kernels.helpers import rowwise

    codec = rowwise.CODECS[np.dtype(dtype)]
    per_thread = codec.reg_vecs if op == "softmax" else norms._reg_vecs(op, codec)
    vecs = max(per_thread * rowwise.CLUSTER_ABOVE_THREADS,
               size // 2 * per_thread * rowwise.PREFERRED_THREADS) + 1
    return vecs * codec.vec
