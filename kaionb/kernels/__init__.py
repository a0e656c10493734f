"""kaionb's kernels: one module per op family, the launch path (``launch``) and the shared
device helpers (``helpers``) that kernels — ours and users' — are written against."""
