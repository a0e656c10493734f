"""kaionb's kernels: one module per op family, the launch path (``launch``) and the shared
device helpers (``helpers``) that kernels — ours and users' — are written against.

Importing the package loads the modules whose kernels DeviceArray methods run —
elementwise (operators, copy, astype, fill), indexing (``a[idx]``, ``a[...] = v``),
reductions (``a.sum()`` ...), matmul (``a @ b``), and creation — so they register with
kaionb.array's hook before any array needs them (array.py never imports kernels)."""

from . import creation, elementwise, indexing, matmul, reductions  # noqa: F401 (register on import)
