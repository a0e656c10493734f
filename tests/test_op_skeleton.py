"""The host path every op shares (kaionb.kernels.op), checked on the CPU: output
resolution and its errors, the empty rule, which kernel each op plans, the array hook, and
the import structure (no cycle between array, kernels and grad).

Arrays here are metadata headers (kaionb.testing.metadata_array); every test that could
reach a kernel replaces the launch, so none touches a GPU."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kaionb
from kaionb import array as array_module
from kaionb.array import bfloat16
from kaionb.kernels import elementwise, launch, op, quantize
from kaionb.kernels.activations import fused_silu_gate, gelu
from kaionb.kernels.elementwise import copy_convert, elementwise_fwd
from kaionb.kernels.helpers.rowwise import rows_view
from kaionb.kernels.norms import layer_norm, rms_norm
from kaionb.kernels.quantize import dequantize_int8, quantize_int8
from kaionb.kernels.softmax import softmax
from kaionb.testing import metadata_array as fake

PACKAGE = Path(kaionb.__file__).parent
F32 = np.float32

# One call per op with an ``out=`` of (4, 8) float32, the shape and dtype it must have.
SINGLE_OUTPUT_OPS = {
    "rms_norm": lambda out: rms_norm(fake((4, 8)), fake((8,)), out=out),
    "layer_norm": lambda out: layer_norm(fake((4, 8)), fake((8,)), fake((8,)), out=out),
    "softmax": lambda out: softmax(fake((4, 8)), out=out),
    "gelu": lambda out: gelu(fake((4, 8)), "tanh", out=out),
    "fused_silu_gate": lambda out: fused_silu_gate(fake((4, 8)), fake((4, 8)), out=out),
    "dequantize_int8": lambda out: dequantize_int8(fake((4, 8), np.int8), fake(()), out=out),
}


@pytest.fixture
def launches(monkeypatch):
    """Launches are recorded instead of run: (kernel name, grid, block, shared, args)."""
    calls = []

    def compiled(kdef, signature):
        def launch_it(grid, block, args, shared_mem=0):
            calls.append((kdef.name, grid, block, shared_mem, args))
        return launch_it

    monkeypatch.setattr(launch.KernelDef, "__getitem__", compiled)
    monkeypatch.setattr(quantize, "zeros", lambda shape, dtype: fake((shape,), dtype))
    monkeypatch.setattr(quantize, "multiprocessor_count", lambda ordinal=None: 132)
    return calls


@pytest.fixture
def no_launch(monkeypatch):
    """Any attempt to get or launch a kernel fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was planned or launched")

    monkeypatch.setattr(launch.KernelDef, "__getitem__", refuse)
    monkeypatch.setattr(launch.CompiledKernel, "__call__", refuse)
    monkeypatch.setattr(quantize, "zeros", refuse)


# -- output resolution ------------------------------------------------------------------

@pytest.mark.parametrize("name", SINGLE_OUTPUT_OPS)
def test_out_checked_with_the_op_named(name, no_launch):
    call = SINGLE_OUTPUT_OPS[name]
    with pytest.raises(ValueError, match=rf"^{name}: argument 'out' expected shape \(4, 8\), "
                                         rf"got \(4, 9\)$"):
        call(fake((4, 9)))
    with pytest.raises(TypeError, match=rf"^{name}: argument 'out' expected dtype float32, "
                                        rf"got float16$"):
        call(fake((4, 8), np.float16))
    with pytest.raises(ValueError, match=rf"^{name}: argument 'out' expected device 0 \(where "
                                         rf"the inputs are\), got device 1$"):
        call(fake((4, 8), device_id=1))
    with pytest.raises(TypeError, match=rf"^{name}: argument 'out' expected device memory .*, "
                                        rf"got a NumPy array"):
        call(np.zeros((4, 8), F32))
    with pytest.raises(TypeError, match=rf"^{name}: argument 'out' expected device memory .*, "
                                        rf"got list$"):
        call([[0.0] * 8] * 4)


# softmax writes an out= of any layout (tests/test_softmax.py, test_softmax_out_any_layout).
@pytest.mark.parametrize("name", [n for n in SINGLE_OUTPUT_OPS if n != "softmax"])
def test_out_layout_is_one_the_kernel_writes(name, no_launch):
    expected = "a contiguous last axis"
    strided_last_axis = fake((4, 16))[:, ::2]
    for out in [strided_last_axis]:
        with pytest.raises(ValueError, match=rf"^{name}: argument 'out' expected {expected}"):
            SINGLE_OUTPUT_OPS[name](out)


@pytest.mark.parametrize("name", list(SINGLE_OUTPUT_OPS))
def test_out_with_strided_rows_is_written_in_place(name, launches):
    out = fake((8, 8))[::2]
    assert SINGLE_OUTPUT_OPS[name](out) is out
    assert launches


def test_quantize_out_is_a_checked_pair(no_launch):
    x = fake((4, 8))
    with pytest.raises(TypeError, match=r"^quantize_int8: argument 'out' expected a tuple of 2 "
                                        r"arrays, got DeviceArray$"):
        quantize_int8(x, out=fake((4, 8), np.int8))
    with pytest.raises(TypeError, match="expected a tuple of 2 arrays, got a tuple of 1$"):
        quantize_int8(x, out=(fake((4, 8), np.int8),))
    with pytest.raises(TypeError, match=r"argument 'out\[0\]' expected dtype int8, got float32"):
        quantize_int8(x, out=(fake((4, 8)), fake(())))
    with pytest.raises(ValueError, match=r"argument 'out\[1\]' expected shape \(8,\), got \(\)"):
        quantize_int8(x, axis=-1, out=(fake((4, 8), np.int8), fake(())))
    with pytest.raises(ValueError, match=r"argument 'out\[1\]' expected a C-contiguous array"):
        quantize_int8(x, axis=0, out=(fake((4, 8), np.int8), fake((8,))[::2]))
    with pytest.raises(ValueError, match=r"argument 'out\[1\]' expected device 0"):
        quantize_int8(x, out=(fake((4, 8), np.int8), fake((), device_id=1)))


def test_quantize_out_pair_is_written_in_place(launches):
    q, scale = fake((4, 8), np.int8), fake((8,))
    got = quantize_int8(fake((4, 8), np.float16), axis=-1, out=[q, scale])
    assert type(got) is tuple and got[0] is q and got[1] is scale
    assert [name for name, *_ in launches] == ["_absmax_cols_fwd_kernel_float16",
                                               "_column_inverses_fwd_kernel",
                                               "_quantize_int8_fwd_kernel_float16"]
    assert launches[1][1] == (1,) and launches[1][4][1] is scale  # the scales, by column


@pytest.mark.parametrize("shape, grid, rows_per_block, row_threads", [
    ((4, 8), (1, 1), 256, 4),              # 3 words4 a row: 64 groups of 4 threads a block
    ((1024, 8192), (5, 52), 20, 256),      # about 2 blocks per SM (132 SMs)
    ((16384, 8192), (5, 64), 256, 256),    # at most 256 rows a thread (the atomics bound it)
    ((65536, 1024), (1, 261), 252, 256),
    ((262144, 256), (1, 261), 1008, 64),   # 4 groups of 64 threads, 252 rows each
    ((20_000_000, 8), (1, 1221), 16384, 4),
    ((20_000_000, 2048), (2, 64936), 308, 256),  # at most 65535 row blocks
])
def test_column_absmax_rows_per_block(launches, shape, grid, rows_per_block, row_threads):
    quantize_int8(fake(shape, np.float16), axis=-1,
                  out=(fake(shape, np.int8), fake((shape[1],))))
    name, got_grid, block, _, args = launches[0]
    assert name == "_absmax_cols_fwd_kernel_float16"
    assert got_grid == grid and args[-2:] == (rows_per_block, row_threads)
    assert got_grid[1] * args[-2] >= shape[0]  # every row in some block
    groups = 256 // row_threads
    assert got_grid[0] * row_threads * 8 >= shape[1] and rows_per_block % (4 * groups) == 0


@pytest.mark.parametrize("dtype, kernel, grid", [
    (np.float16, "quantize_int8_fwd_kernel_float16", (528, 1)),    # halves: 4 blocks per SM
    (np.float32, "quantize_int8_fwd_kernel_float32", (8192, 1)),   # float32: one per 16 KB
])
def test_per_tensor_passes_walk_one_capped_row(launches, dtype, kernel, grid):
    """Per tensor over a contiguous x: one long row, the absmax on at most 32 blocks per SM
    (132 SMs), the quantize pass capped for halves only."""
    x = fake((16384, 8192), dtype)
    quantize_int8(x, out=(fake((16384, 8192), np.int8), fake(())))
    (absmax, absmax_grid, *_), (name, quantize_grid, _, _, args) = launches
    assert absmax.startswith("_absmax_fwd_kernel") and absmax_grid == (4224, 1)
    assert name == "_" + kernel and quantize_grid == grid
    assert args[0].shape == (1, 16384 * 8192) and args[-3:] == (16384 * 8192, 0, 16384 * 8192)


@pytest.mark.parametrize("x, q, kernel, n, ncols", [
    # Rows of a multiple of 16 elements, contiguous and aligned: end to end, capped.
    (fake((64, 208), np.float16), fake((64, 208), np.int8), "_flat", 64 * 208, 208),
    (fake((4, 33, 64)), fake((4, 33, 64), np.int8), "_flat", 4 * 33 * 64, 64),
    # 200 % 16 != 0, or a strided x: one block per row, as before.
    (fake((64, 200), np.float16), fake((64, 200), np.int8), "", 200, 200),
    (fake((64, 416), np.float16)[:, :208], fake((64, 208), np.int8), "", 208, 208),
])
def test_per_column_quantize_pass_end_to_end(launches, x, q, kernel, n, ncols):
    quantize_int8(x, axis=-1, out=(q, fake((x.shape[-1],))))
    name, grid, _, _, args = launches[-1]
    assert name == f"_quantize_int8{kernel}_fwd_kernel_{x.dtype.name}"
    assert args[-3:] == (n, quantize.COL, ncols)
    if kernel:
        assert args[0].shape == (1, n) and grid[1] == 1 and grid[0] <= 4 * 132


@pytest.mark.parametrize("shape, axis, flat", [
    ((64, 4096), 0, True), ((64, 4096), -1, True), ((3, 8176), 0, True),
    ((64, 8192), 0, False),   # a row fills a block step: one block per row
    ((64, 200), 0, False),    # 200 % 16 != 0
    ((1, 4096), 0, False),    # one row: nothing to put end to end
])
def test_dequantize_narrow_rows_end_to_end(launches, shape, axis, flat):
    scale = fake((shape[0] if axis == 0 else shape[1],))
    dequantize_int8(fake(shape, np.int8), scale, axis, np.float16, out=fake(shape, np.float16))
    (name, grid, _, _, args), = launches
    assert name == "_dequantize_int8" + ("_flat" if flat else "") + "_fwd_kernel_float16"
    mode = quantize.ROW if axis == 0 else quantize.COL
    rows, n = shape
    assert args[-3:] == ((rows * n, mode, n) if flat else (n, mode, n))


# -- the empty rule ---------------------------------------------------------------------

EMPTY_CALLS = {
    "rms_norm": lambda: rms_norm(fake((0, 8)), fake((8,)), out=fake((0, 8))),
    "layer_norm": lambda: layer_norm(fake((3, 0)), fake((0,)), fake((0,)), out=fake((3, 0))),
    "softmax": lambda: softmax(fake((2, 0, 8)), out=fake((2, 0, 8))),
    "gelu": lambda: gelu(fake((0,)), out=fake((0,))),
    "fused_silu_gate": lambda: fused_silu_gate(fake((2, 0)), fake((2, 0)), out=fake((2, 0))),
    "quantize_int8": lambda: quantize_int8(fake((0, 8)), axis=-1,
                                           out=(fake((0, 8), np.int8), fake((8,)))),
    # Per-row scales of no rows: shape (0,), as quantize_int8 returns them.
    "dequantize_int8": lambda: dequantize_int8(fake((0, 8), np.int8), fake((0,)), axis=0,
                                               out=fake((0, 8))),
    "copy_convert": lambda: copy_convert(fake((0, 3)), fake((0, 3), np.float16)),
    "add": lambda: elementwise_fwd("add", fake((0, 4)), fake((0, 4)), out=fake((0, 4))),
}


@pytest.mark.parametrize("name", EMPTY_CALLS)
def test_empty_input_returns_without_a_launch(name, no_launch):
    EMPTY_CALLS[name]()


def test_empty_input_is_still_validated(no_launch):
    with pytest.raises(ValueError, match="rms_norm: argument 'weight' expected shape"):
        rms_norm(fake((0, 8)), fake((7,)), out=fake((0, 8)))
    with pytest.raises(ValueError, match="softmax: argument 'out' expected shape"):
        softmax(fake((0, 8)), out=fake((0, 9)))
    with pytest.raises(ValueError, match="add: shape mismatch"):
        elementwise_fwd("add", fake((0, 3)), fake((0, 4)))


def test_run_calls_the_launch_with_the_outputs_last():
    seen = []
    out, pair, empty_pair = fake((2,)), (fake((1,)), fake(())), (fake((1,)), fake((0,)))
    assert op.run(lambda *a: seen.append(a), "x", out=out) is out
    assert op.run(lambda *a: seen.append(a), "x", out=pair) is pair
    assert op.run(lambda *a: seen.append(a), "x", out=empty_pair) is empty_pair
    assert seen == [("x", out), ("x", *pair)]


# -- plans -------------------------------------------------------------------------------

class _FakeKernelDef:
    """What Plan uses of a KernelDef: its signatures, and ``[signature]`` to compile."""

    name = "_fake_fwd_kernel"

    def __init__(self, signatures):
        self.signatures, self.launched = signatures, []

    def __getitem__(self, signature):
        return lambda grid, block, args, shared_mem: self.launched.append(
            (signature, grid, block, args, shared_mem))


def test_plan_launches_its_kernel_with_its_configuration():
    kdef = _FakeKernelDef(["void(int32, int32)"])
    op.Plan.of(kdef, (3, 2), (128,), 4096).launch(7, 8)
    assert kdef.launched == [("void(int32, int32)", (3, 2), (128,), (7, 8), 4096)]
    with pytest.raises(TypeError, match="_fake_fwd_kernel has 2 specializations"):
        op.Plan.of(_FakeKernelDef(["void(int32)", "void(int64)"]), (1,), (1,))


def test_plan_cache_keeps_the_newest_plans():
    cache = op.PlanCache(size=2)
    assert cache.put("a", 1) == 1 and cache.put("b", 2) == 2
    cache.put("a", 10)  # a replaced plan does not evict another
    assert len(cache) == 2 and cache.get("b") == 2
    cache.put("c", 3)  # the oldest key ("a") goes
    assert cache.get("a") is None and cache.get("b") == 2 and cache.get("c") == 3
    cache.clear()
    assert len(cache) == 0 and cache.get("c") is None


PLANNED = [
    (lambda: rms_norm(fake((4, 8), bfloat16), fake((8,), bfloat16), out=fake((4, 8), bfloat16)),
     ["_rms_norm_fwd_kernel_bfloat16"]),
    (lambda: layer_norm(fake((4, 8)), fake((8,)), out=fake((4, 8))),
     ["_layer_norm_fwd_kernel_float32"]),
    (lambda: softmax(fake((4, 8), np.float16), out=fake((4, 8), np.float16)),
     ["_softmax_fwd_kernel_float16"]),
    (lambda: gelu(fake((4, 8)), out=fake((4, 8))), ["_gelu_fwd_kernel_float32"]),
    (lambda: gelu(fake((4, 8)), "tanh", out=fake((4, 8))), ["_gelu_fwd_kernel_tanh_float32"]),
    (lambda: fused_silu_gate(fake((8,)), fake((8,)), out=fake((8,))),
     ["_fused_silu_gate_fwd_kernel_float32"]),
    (lambda: quantize_int8(fake((4, 8)), axis=0, out=(fake((4, 8), np.int8), fake((4,)))),
     ["_absmax_fwd_kernel_float32", "_quantize_int8_fwd_kernel_float32"]),
    (lambda: dequantize_int8(fake((4, 8), np.int8), fake(()), dtype=bfloat16,
                             out=fake((4, 8), bfloat16)),
     ["_dequantize_int8_fwd_kernel_bfloat16"]),
    (lambda: copy_convert(fake((4, 8), bfloat16), fake((4, 8), np.float16)),
     ["_elementwise_copy_bfloat16_s_s_as_float16_x_x_to_float16_vector_kernel"]),
    (lambda: copy_convert(fake((4, 8), np.int8).T, fake((8, 4), np.int8)),
     ["_elementwise_copy_int8_s_s_as_int8_x_x_to_int8_strided_kernel"]),
    (lambda: elementwise_fwd("add", fake((4, 8)), fake((4, 8)), out=fake((4, 8))),
     ["_elementwise_add_float32_float32_s_as_float32_float32_x_to_float32_vector_kernel"]),
    # One operand off 16-byte alignment, or itemsizes that differ: the flat kernel.
    (lambda: elementwise_fwd("add", fake((9,))[1:], fake((8,)), out=fake((8,))),
     ["_elementwise_add_float32_float32_s_as_float32_float32_x_to_float32_flat_kernel"]),
    (lambda: copy_convert(fake((4, 8), np.float16), fake((4, 8))),
     ["_elementwise_copy_float16_s_s_as_float32_x_x_to_float32_flat_kernel"]),
    # Two axes that do not merge, rows whole words4 apart: the rows kernel (a row broadcast).
    (lambda: elementwise_fwd("add", fake((4, 8)), fake((8,)), out=fake((4, 8))),
     ["_elementwise_add_float32_float32_s_as_float32_float32_x_to_float32_rows_kernel"]),
]


@pytest.mark.parametrize("call, kernels", PLANNED, ids=[k[-1] for _, k in PLANNED])
def test_each_op_plans_the_kernel_named_for_its_dtype_and_variant(call, kernels, launches,
                                                                  monkeypatch):
    monkeypatch.setattr(elementwise, "multiprocessor_count", lambda: 132)
    call()
    assert [name for name, *_ in launches] == kernels


def test_row_op_launch_configuration(launches):
    x = fake((6, 4096), np.float16)
    rms_norm(x, fake((4096,), np.float16), out=fake((6, 4096), np.float16))
    (_, grid, block, shared, args), = launches
    # One block per row; an aligned 4096-wide f16 row sits in registers (no shared memory).
    assert grid == (6,) and block == (256,) and shared == 0
    assert args[3].shape == (6, 4096) and args[4:] == (4096, 1e-6, 0, -1)


def test_op_kernels_follow_the_naming_scheme():
    modules = {"norms", "softmax", "activations", "quantize"}
    names = [k.name for k in launch.all_kernels()
             if k.pyfunc.__module__.rpartition(".")[2] in modules]
    assert len(names) >= 30
    assert [n for n in names if not re.fullmatch(r"_[a-z0-9_]+_(fwd|bwd)_kernel(_\w+)?", n)] == []
    # The elementwise family: op, operand dtypes ("s" a scalar), loop dtypes, output, the
    # tiled layout's staged operands, layout.
    family = [k.name for k in elementwise._samples()]
    assert [n for n in family if not re.fullmatch(
        r"_elementwise_[a-z_]+?_((\w+?|s)_){3}as_\w+_to_[a-z0-9]+"
        r"(_(vector|flat|rows|strided)|(_staging_x[012])+_tiled)_kernel", n)] == []


def test_rows_view_refuses_with_the_one_message_format():
    tangled = fake((4, 6, 8))[:, :3]  # rows 48 bytes apart within a batch, 192 across
    with pytest.raises(ValueError, match=r"^softmax: argument 'x' expected leading axes that "
                                         r"collapse to one row stride .*, got shape"):
        rows_view("softmax", "x", tangled)


# -- the array hook ------------------------------------------------------------------------

def test_array_hooks_are_filled_once_kaionb_is_imported():
    assert set(array_module._HOOKED) == set(array_module.KERNEL_HOOKS)
    assert array_module._HOOKED["copy_convert"] is copy_convert
    assert array_module._HOOKED["matmul"] is kaionb.matmul


def test_matmul_operator_goes_through_the_hook(monkeypatch):
    seen = []
    monkeypatch.setitem(array_module._HOOKED, "matmul", lambda a, b: seen.append((a, b)))
    a, b = fake((2, 3)), fake((3, 4))
    a @ b
    a.__rmatmul__(b)
    assert seen == [(a, b), (b, a)]


@pytest.mark.parametrize("hook, use", [
    ("matmul", lambda: fake((2, 3)) @ fake((3, 4))),
    ("copy_convert", lambda: array_module._copy_into(fake((2, 3), np.float16), fake((2, 3)))),
])
def test_missing_hook_is_a_clear_error(hook, use, monkeypatch):
    monkeypatch.delitem(array_module._HOOKED, hook, raising=False)
    with pytest.raises(RuntimeError, match=f"'{hook}' kernel, which no kaionb.kernels module "
                                           "has registered"):
        use()


def test_only_the_named_hooks_register():
    with pytest.raises(ValueError, match="'transpose' is not one of"):
        array_module.register_kernel("transpose", lambda a: a)


# -- import structure ----------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, module_level: bool) -> set[str]:
    """The kaionb modules ``path`` imports (those run while it loads when
    ``module_level``: function bodies left out), with the packages each import loads."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            # Importing a.b.c loads a.b first; packages around ``name`` are loaded already.
            found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1)
                         if not (name + ".").startswith(".".join(parts[:i]) + "."))
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_between_kaionb_modules():
    # The package root imports everything on purpose and is always loaded first.
    graph = {_module_name(p): _imports(p, module_level=True) - {"kaionb"}
             for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py"}
    done, path = set(), []

    def visit(module):
        if module in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            visit(dep)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert "kaionb.kernels.elementwise" in graph["kaionb.grad.tape"]  # the parser sees imports


def test_array_and_the_tape_record_sit_below_the_kernels():
    array_imports = _imports(PACKAGE / "array.py", module_level=False)
    assert not {m for m in array_imports if m.startswith(("kaionb.kernels", "kaionb.grad"))}
    assert not _imports(PACKAGE / "grad" / "record.py", module_level=False)
    assert "kaionb.grad.record" in _imports(PACKAGE / "kernels" / "op.py", module_level=True)


@pytest.mark.parametrize("statement", [
    "import kaionb.array", "import kaionb.grad", "import kaionb.kernels.norms",
    "import kaionb.grad.record", "from kaionb.grad import Tape, gradcheck, record",
])
def test_each_entry_imports_in_a_fresh_interpreter(statement):
    result = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
