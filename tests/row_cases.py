"""The shapes and dtypes every row-wise op (norms, softmax, activations, INT8
quantization) is checked on: the row widths and row counts of issue 4, each dtype."""

import numpy as np

from kaionb.array import bfloat16

DTYPES = [np.float32, np.float16, bfloat16]
WIDTHS = [1, 7, 33, 1000, 4096, 8191, 65537, 262144]
ROWS = [1, 3, 16384]
MAX_ELEMENTS = 1 << 23  # float64 references stay small (16384-row cases: widths ≤ 33)
CASES = [(r, n) for r in ROWS for n in WIDTHS if r * n <= MAX_ELEMENTS]
