"""The one factory that turns a PTX template into a numba intrinsic.

Every instruction in ``kaionb.ptx_patches`` is declared through :func:`ptx_instruction`:
a PTX template in LLVM inline-asm syntax (``$0``, ``$1``, ... number the outputs first,
then the inputs), an operand list, numba types for the inputs and outputs, and flags. The
factory builds an ``llvmlite.ir.InlineAsm`` call; several outputs come back as a numba
tuple (the asm returns a ``LiteralStructType`` that is unpacked with ``make_tuple``).

Constraint letters (LLVM NVPTX): ``h`` 16-bit, ``r`` 32-bit, ``l`` 64-bit, ``f`` f32,
``d`` f64, ``n`` an immediate. They are derived from the numba types, so a declaration
names only types.

Arch gating: an instruction may declare the architectures it assembles for. The check
runs while numba lowers the kernel and reads the target compute capability from numba's
compilation flags (``ConfigStack().top().compute_capability``: the ``cc`` given to
``compile_ptx``, or the current device's for a launched kernel), so compiling a Hopper
instruction for sm_80 fails at compile time with a message naming the instruction and the
architecture it needs, instead of a ptxas error on the whole module.

Simulator: under ``NUMBA_ENABLE_CUDASIM=1`` every instruction is a plain Python function
that raises ``NotImplementedError`` naming the PTX instruction — there is no PTX to run.
"""

from __future__ import annotations

import inspect

from llvmlite import ir
from numba import config, cuda, types
from numba.cuda.core import targetconfig
from numba.cuda.extending import intrinsic

# Numba type -> LLVM inline-asm register constraint.
_CONSTRAINT = {
    types.uint16: "h",
    types.int16: "h",
    types.uint32: "r",
    types.int32: "r",
    types.uint64: "l",
    types.int64: "l",
    types.float32: "f",
    types.float64: "d",
}


def device_function(fn):
    """``@cuda.jit(device=True, forceinline=True)``; plain ``device=True`` under the
    simulator, whose ``jit`` has no ``forceinline``. Every kaionb device helper uses it."""
    if config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


class ArchitectureError(TypeError):
    """An instruction was compiled for an architecture that does not have it."""


def target_cc():
    """The compute capability numba is compiling for, e.g. ``(8, 0)`` or ``(9, 0, "a")``.

    Valid only while numba compiles (typing or lowering); ``None`` outside a compilation.
    """
    flags = targetconfig.ConfigStack.top_or_none()
    return None if flags is None else flags.compute_capability


def check_arch(instruction: str, arch_ok, needs: str) -> None:
    """Raise :class:`ArchitectureError` if the target cc fails ``arch_ok(cc[:2])``."""
    cc = target_cc()
    if cc is not None and not arch_ok(tuple(cc[:2])):
        got = "sm_%d%d%s" % (cc[0], cc[1], cc[2] if len(cc) > 2 else "")
        raise ArchitectureError(
            f"{instruction} needs {needs}, but this kernel is being compiled for {got}"
        )


# The ``arch`` of the Hopper instructions. wgmma and setmaxnreg exist only in the
# arch-specific target sm_90a (a kernel that uses them must be compiled with
# ``cc=(9, 0, "a")``); mbarrier transaction counts, bulk copies and clusters from sm_90 on.
SM90A = (lambda cc: cc == (9, 0), "sm_90a")
SM90 = (lambda cc: cc >= (9, 0), "sm_90 or newer")


class Immediate:
    """An operand that must be a compile-time integer constant (constraint ``n``).

    Used for counts and lookup tables that PTX takes only as immediates, e.g. the N of
    ``cp.async.wait_group N`` or the LUT of ``lop3.b32``.
    """

    def __repr__(self):
        return "Immediate"


IMM = Immediate()


def _flat(ty):
    """Scalar operands of one declared type: a tuple type is one operand per element."""
    return list(ty.types) if isinstance(ty, types.BaseTuple) else [ty]


def simulator_stub(name: str, instruction: str, doc: str):
    """What an instruction is under the CUDA simulator: a function that raises."""

    def stub(*args):
        raise NotImplementedError(
            f"{name} emits inline PTX ({instruction}); the CUDA simulator "
            "(NUMBA_ENABLE_CUDASIM=1) cannot run inline PTX. Run on a GPU."
        )

    stub.__name__ = name
    stub.__doc__ = doc
    return stub


def ptx_instruction(
    name: str,
    template: str,
    *,
    outputs=None,
    inputs=(),
    tied: int | None = None,
    side_effect: bool = False,
    memory: bool = False,
    arch=None,
    instruction: str | None = None,
    doc: str = "",
):
    """Declare one inline-PTX instruction as a numba intrinsic.

    name        the Python name (shows in errors and the simulator stub).
    template    PTX in LLVM inline-asm syntax. ``$0..`` number the scalar outputs first,
                then the scalar inputs (a tuple operand counts one per element).
    outputs     None (void), a numba scalar type, or a numba tuple type (returned as a
                tuple: ``types.UniTuple(types.float32, 4)``).
    inputs      numba types of the inputs, or :data:`IMM` for a compile-time integer.
                Call-site values are cast to the declared types.
    tied        index of a tuple input whose elements share registers with the outputs
                (an accumulator updated in place, as wgmma requires); such inputs get no
                ``$`` number of their own in the template.
    side_effect the asm must not be removed, merged or hoisted (stores, barriers, async
                copies, loads that must stay after a barrier).
    memory      add the ``~{memory}`` clobber: the compiler may not move memory accesses
                across it.
    arch        ``(predicate((major, minor)) -> bool, "sm_90a")``: where it exists.
    instruction the PTX mnemonic for messages (default: the template's first word).
    """
    instruction = instruction or template.split()[0].strip("{;")
    doc = doc or f"Emit ``{instruction}``."
    if config.ENABLE_CUDASIM:
        return simulator_stub(name, instruction, doc)

    ins = tuple(inputs)
    out_scalars = [] if outputs is None else _flat(outputs)
    constraints = ["=" + _CONSTRAINT[t] for t in out_scalars]
    tied_constraints = []
    for i, ty in enumerate(ins):
        if ty is IMM:
            constraints.append("n")
        elif i == tied:
            tied_constraints += [str(k) for k in range(len(_flat(ty)))]
        else:
            constraints += [_CONSTRAINT[t] for t in _flat(ty)]
    # LLVM requires tied inputs after the other inputs.
    constraints += tied_constraints
    if memory:
        constraints.append("~{memory}")
    constraint_str = ",".join(constraints)

    def codegen(context, builder, signature, args):
        if arch is not None:
            check_arch(instruction, *arch)
        operands, tied_operands = [], []
        for i, (declared, actual, value) in enumerate(zip(ins, signature.args, args)):
            if declared is IMM:
                operands.append(ir.Constant(ir.IntType(32), actual.literal_value))
            elif isinstance(declared, types.BaseTuple):
                elems = [builder.extract_value(value, k) for k in range(len(declared))]
                (tied_operands if i == tied else operands).extend(elems)
            else:
                operands.append(value)
        operands += tied_operands
        llvm_outs = [context.get_value_type(t) for t in out_scalars]
        if outputs is None:
            asm_ret = ir.VoidType()
        elif isinstance(outputs, types.BaseTuple):
            asm_ret = ir.LiteralStructType(llvm_outs)
        else:
            asm_ret = llvm_outs[0]
        fnty = ir.FunctionType(asm_ret, [op.type for op in operands])
        asm = ir.InlineAsm(fnty, template, constraint_str, side_effect=side_effect)
        result = builder.call(asm, operands)
        if outputs is None:
            return context.get_dummy_value()
        if isinstance(outputs, types.BaseTuple):
            values = [builder.extract_value(result, k) for k in range(len(out_scalars))]
            return context.make_tuple(builder, outputs, values)
        return result

    def typer(typingctx, *args):
        if len(args) != len(ins):
            raise TypeError(f"{name} takes {len(ins)} arguments, got {len(args)}")
        if arch is not None:
            check_arch(instruction, *arch)
        arg_types = []
        for declared, actual in zip(ins, args):
            if declared is IMM:
                if not isinstance(actual, types.IntegerLiteral):
                    # No match: numba retries with literal types where the call site
                    # has constants, and reports "no implementation" where it has not.
                    return None
                arg_types.append(actual)
            else:
                arg_types.append(declared)
        ret = types.void if outputs is None else outputs
        return ret(*arg_types), codegen

    # numba folds call arguments against the typer's Python signature, so give the
    # variadic typer a fixed one: (typingctx, a0, a1, ...).
    params = [inspect.Parameter("typingctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [
        inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for i in range(len(ins))
    ]
    typer.__signature__ = inspect.Signature(params)
    typer.__name__ = name
    typer.__doc__ = doc
    func = intrinsic(typer)
    func.__doc__ = doc
    return func
