"""kaionb's kernels: one module per op family, the launch path (``launch``) and the shared
device helpers (``helpers``) that kernels — ours and users' — are written against.

Importing the package loads the two modules whose kernels DeviceArray methods run —
elementwise (copy, astype, fill) and matmul (``a @ b``) — so they register with
kaionb.array's hook before any array needs them (array.py never imports kernels)."""

from . import creation, elementwise, indexing, matmul, reductions  # noqa: F401 (register on import)
