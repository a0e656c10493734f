"""DeviceArray: an n-dimensional array in GPU memory that speaks NumPy's vocabulary.

Memory comes from CUDA's stream-ordered allocator (cuda.core's ``DeviceMemoryResource``,
i.e. ``cuMemAllocFromPoolAsync``) on the current stream and goes back to it when the last
array viewing it dies. Arrays made from other libraries' memory (CuPy, PyTorch, numba —
anything with ``__dlpack__`` or ``__cuda_array_interface__``) are zero-copy: same pointer,
the producer kept alive for as long as any view of it lives.

Strides are in bytes, as in NumPy. Host transfer happens only when asked (``.get()``).
"""

from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

from . import _block_cache, _device
from ._device import (
    STATE,
    Stream,
    allocation_stream,
    check_driver,
    current_allocator,
    current_device,
    current_ordinal,
    current_stream,
    device_ordinal,
    enter_device,
    leave_device,
    stream_of,
    graph_allocator,
    is_capturing,
    peer_copy,
)
from ._device import device as on_device

# The element types kaionb stores. Half types are NumPy dtypes through ml_dtypes.
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    np.float64, np.float32, np.float16, ml_dtypes.bfloat16,
    np.int64, np.uint64, np.int32, np.uint32, np.int16, np.uint16, np.int8, np.uint8, np.bool_))
bfloat16 = np.dtype(ml_dtypes.bfloat16)

# DLPack device types (dlpack.h): what counts as memory a kernel may touch.
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13
_DLPACK_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA pinned host", 4: "OpenCL", 7: "Vulkan",
                        8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed",
                        14: "oneAPI"}


_DTYPE_CACHE: dict = {}


def normalize_dtype(dtype, where: str = "kaionb") -> np.dtype:
    """``dtype`` as a NumPy dtype kaionb can store, or a TypeError naming ``where``."""
    try:
        return _DTYPE_CACHE[dtype]  # hot path: every op normalizes its dtypes
    except (KeyError, TypeError):
        pass
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{where}: {dtype!r} is not a dtype") from exc
    if dt not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{where}: dtype {dt} is not supported (supported: {names})")
    try:
        _DTYPE_CACHE[dtype] = dt
    except TypeError:
        pass
    return dt


def normalize_shape(shape, where: str = "kaionb") -> tuple[int, ...]:
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape  # hot path
    if isinstance(shape, (numbers.Integral, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{where}: shape must be an int or a tuple of ints, got "
                        f"{type(shape).__name__}") from None
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (numbers.Integral, np.integer)):
            raise TypeError(f"{where}: shape entries must be ints, got {d!r} in {dims}")
        if d < 0:
            raise ValueError(f"{where}: shape entries must be >= 0, got {dims}")
        out.append(int(d))
    return tuple(out)


def _contiguous_strides(shape, itemsize) -> tuple[int, ...]:
    if len(shape) == 1:
        return (itemsize,)
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _is_array_index(k) -> bool:
    """Whether a subscript entry is an array (integer indices or a boolean mask)."""
    return not isinstance(k, (slice, int, np.integer, type(None), type(Ellipsis))) and (
        isinstance(k, (DeviceArray, np.ndarray, list)) or hasattr(k, "__cuda_array_interface__")
        or hasattr(k, "__dlpack__"))


def _reshape_strides(shape, strides, new_shape):
    """Strides that walk a non-empty (shape, strides) array in C order as ``new_shape``, or
    None when no such strides exist (NumPy's no-copy reshape rule): each group of old
    axes that multiplies to a group of new axes must be contiguous within itself."""
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    new_strides = [0] * len(new_shape)
    oi = ni = 0
    while ni < len(new_shape) and oi < len(old):
        n_size, o_size = new_shape[ni], old[oi][0]
        nj, oj = ni + 1, oi + 1
        while n_size != o_size:
            if n_size < o_size:
                n_size *= new_shape[nj]
                nj += 1
            else:
                o_size *= old[oj][0]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_shape[k]
        ni, oi = nj, oj
    for k in range(ni, len(new_shape)):  # trailing size-1 axes: any stride walks them
        new_strides[k] = new_strides[ni - 1] if ni else 0
    return tuple(new_strides)


def _binary_operator(name: str, *, reflected: bool = False, in_place: bool = False):
    """A DeviceArray operator running elementwise op ``name`` (in place: into self)."""
    if in_place:
        def operator_method(self, other):
            return _kernel("elementwise")(name, self, other, out=self)
    elif reflected:
        def operator_method(self, other):
            return _kernel("elementwise")(name, other, self)
    else:
        def operator_method(self, other):
            return _kernel("elementwise")(name, self, other)
    return operator_method


class Flags:
    """What NumPy's ``ndarray.flags`` says about contiguity."""

    __slots__ = ("c_contiguous", "f_contiguous")

    def __init__(self, c_contiguous: bool, f_contiguous: bool):
        self.c_contiguous = c_contiguous
        self.f_contiguous = f_contiguous

    def __getitem__(self, name: str) -> bool:
        key = {"C_CONTIGUOUS": "c_contiguous", "C": "c_contiguous", "CONTIGUOUS": "c_contiguous",
               "F_CONTIGUOUS": "f_contiguous", "F": "f_contiguous",
               "FORTRAN": "f_contiguous"}.get(name.upper())
        if key is None:
            raise KeyError(f"DeviceArray.flags: unknown flag {name!r}")
        return getattr(self, key)

    def __repr__(self) -> str:
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}"


class DeviceArray:
    """An n-dimensional array in GPU memory that speaks NumPy's vocabulary.

    Create arrays with :func:`asarray`, :func:`empty`, :func:`zeros`, :func:`arange` and
    the other creation functions; the constructor only wraps existing device memory
    (no checks). Strides are in bytes, as NumPy's. Basic indexing (ints, slices with
    steps, ``...``, ``None``) gives views; an integer array or a boolean mask gathers a
    copy; ``a[key] = value`` writes in place. Operators (``+ - * / // % ** & | ^ ~``,
    comparisons, ``@``) call kaionb's elementwise ops and :func:`matmul`. Host transfer
    happens only when asked (:meth:`get`, :meth:`item`); ``np.asarray(a)`` refuses.
    Other libraries import it zero-copy through ``__dlpack__`` (bfloat16 included) or
    ``__cuda_array_interface__``; ``a.__array_namespace__()`` is the kaionb module.

    Parameters
    ----------
    shape : tuple of int
        The shape.
    dtype : numpy.dtype
        One of the dtypes kaionb stores.
    strides : tuple of int
        Byte strides, one per axis.
    ptr : int
        The device address of element ``[0, ..., 0]``.
    owner : object
        What keeps the memory alive (a cuda.core Buffer or the producer), or None.
    device_id : int, optional
        The ordinal of the GPU the memory is on.

    Attributes
    ----------
    shape : tuple of int
        The array's dimensions.
    dtype : numpy.dtype
        The element type.
    strides : tuple of int
        Bytes to step in each dimension.
    ndim : int
        The number of dimensions.
    ptr : int
        The device address of the first element.
    device_id : int
        The ordinal of the GPU the array lives on.
    requires_grad : bool
        Whether ops record this array's gradient on an active :class:`kaionb.grad.Tape`.
    grad : DeviceArray or None
        The gradient :meth:`kaionb.grad.Tape.backward` accumulated (float32).

    Examples
    --------
    >>> a = kaionb.asarray(np.arange(6.0).reshape(2, 3))
    >>> a.shape, a.dtype, a.strides
    ((2, 3), dtype('float64'), (24, 8))
    >>> a.T.get()
    array([[0., 3.],
           [1., 4.],
           [2., 5.]])
    >>> (a[:, 1:] * 2).get()
    array([[ 2.,  4.],
           [ 8., 10.]])
    """

    __slots__ = ("shape", "strides", "dtype", "ptr", "device_id", "ndim", "_owner", "_layout",
                 "_numba_abi", "requires_grad", "grad", "__weakref__")

    # Keep NumPy from treating us as a sequence in mixed expressions (ndarray op DeviceArray).
    __array_priority__ = 100

    def __init__(self, shape, dtype, strides, ptr, owner, device_id=0):
        self.shape = shape
        self.dtype = dtype
        self.strides = strides
        self.ptr = ptr
        self.device_id = device_id
        self.ndim = len(shape)
        self._owner = owner  # keeps the memory alive: a cuda.core Buffer or a producer
        # numba's kernel ABI for an array argument: meminfo, parent, nitems, itemsize, data,
        # shape, strides (kernels.launch packs this tuple as is).
        self._numba_abi = (0, 0, math.prod(shape), dtype.itemsize, ptr) + shape + strides
        self.requires_grad = False
        self.grad = None
        self._layout = None  # kernels.op's signature of this array, made on first use

    # -- NumPy vocabulary --------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of elements: the product of ``shape``.

        Examples
        --------
        >>> kaionb.zeros((2, 3)).size
        6
        """
        return self._numba_abi[2]

    @property
    def itemsize(self) -> int:
        """Bytes per element.

        Examples
        --------
        >>> kaionb.zeros(4, kaionb.bfloat16).itemsize
        2
        """
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes the elements take: ``size * itemsize`` (a view's, not its base's).

        Examples
        --------
        >>> kaionb.zeros((2, 3), np.float32).nbytes
        24
        """
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> int:
        """The ordinal of the GPU the array lives on (the array API's name).

        Examples
        --------
        >>> kaionb.zeros(3, device=0).device
        0
        """
        return self.device_id

    @property
    def data_ptr(self) -> int:
        """The device address of the first element (``ptr``).

        Examples
        --------
        >>> a = kaionb.zeros(4)
        >>> a[1:].data_ptr - a.data_ptr
        8
        """
        return self.ptr

    @property
    def is_c_contiguous(self) -> bool:
        """Whether the elements lie in C order with no gaps.

        Examples
        --------
        >>> a = kaionb.zeros((2, 3))
        >>> a.is_c_contiguous, a.T.is_c_contiguous
        (True, False)
        """
        return self.size <= 1 or all(
            st == cst for d, st, cst in zip(self.shape, self.strides,
                                           _contiguous_strides(self.shape, self.itemsize))
            if d != 1)

    @property
    def T(self) -> "DeviceArray":
        """The view with the axes reversed, as :meth:`transpose` with no arguments.

        Examples
        --------
        >>> kaionb.zeros((2, 3)).T.shape
        (3, 2)
        """
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device_id}, "
                f"ptr=0x{self.ptr:x})")

    def __array__(self, *args, **kwargs):
        raise TypeError("DeviceArray lives in GPU memory: call .get() to copy it to a NumPy "
                        "array explicitly")

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError("the truth value of a DeviceArray with more than one element is "
                             "ambiguous")
        return bool(self.get())

    def __matmul__(self, other):
        return _kernel("matmul")(self, other)

    def __rmatmul__(self, other):
        return _kernel("matmul")(other, self)

    # -- arithmetic: operators are kaionb.kernels.elementwise ops (NumPy broadcasting and
    # promotion); NumPy arrays on the left defer to us (``__array_ufunc__ = None``).
    __array_ufunc__ = None
    __hash__ = None  # == is elementwise, as NumPy's: arrays are not hashable

    __add__ = _binary_operator("add")
    __radd__ = _binary_operator("add", reflected=True)
    __iadd__ = _binary_operator("add", in_place=True)
    __sub__ = _binary_operator("subtract")
    __rsub__ = _binary_operator("subtract", reflected=True)
    __isub__ = _binary_operator("subtract", in_place=True)
    __mul__ = _binary_operator("multiply")
    __rmul__ = _binary_operator("multiply", reflected=True)
    __imul__ = _binary_operator("multiply", in_place=True)
    __truediv__ = _binary_operator("divide")
    __rtruediv__ = _binary_operator("divide", reflected=True)
    __itruediv__ = _binary_operator("divide", in_place=True)
    __floordiv__ = _binary_operator("floor_divide")
    __rfloordiv__ = _binary_operator("floor_divide", reflected=True)
    __ifloordiv__ = _binary_operator("floor_divide", in_place=True)
    __mod__ = _binary_operator("remainder")
    __rmod__ = _binary_operator("remainder", reflected=True)
    __imod__ = _binary_operator("remainder", in_place=True)
    __pow__ = _binary_operator("pow")
    __rpow__ = _binary_operator("pow", reflected=True)
    __ipow__ = _binary_operator("pow", in_place=True)
    __and__ = _binary_operator("bitwise_and")
    __rand__ = _binary_operator("bitwise_and", reflected=True)
    __iand__ = _binary_operator("bitwise_and", in_place=True)
    __or__ = _binary_operator("bitwise_or")
    __ror__ = _binary_operator("bitwise_or", reflected=True)
    __ior__ = _binary_operator("bitwise_or", in_place=True)
    __xor__ = _binary_operator("bitwise_xor")
    __rxor__ = _binary_operator("bitwise_xor", reflected=True)
    __ixor__ = _binary_operator("bitwise_xor", in_place=True)
    __eq__ = _binary_operator("equal")
    __ne__ = _binary_operator("not_equal")
    __lt__ = _binary_operator("less")
    __le__ = _binary_operator("less_equal")
    __gt__ = _binary_operator("greater")
    __ge__ = _binary_operator("greater_equal")

    def __neg__(self):
        return _kernel("elementwise")("negative", self)

    def __pos__(self):
        return _kernel("elementwise")("positive", self)

    def __abs__(self):
        return _kernel("elementwise")("abs", self)

    def __invert__(self):
        return _kernel("elementwise")("bitwise_invert", self)

    # -- reductions (kaionb.kernels.reductions; NumPy's result dtypes) -----------------------
    # Their docstrings come from that module's template (_docstring), set where it registers
    # its kernels.
    def sum(self, axis=None, *, dtype=None, keepdims=False, out=None):
        return _kernel("sum")(self, axis, dtype=dtype, keepdims=keepdims, out=out)

    def prod(self, axis=None, *, dtype=None, keepdims=False, out=None):
        return _kernel("prod")(self, axis, dtype=dtype, keepdims=keepdims, out=out)

    def mean(self, axis=None, *, keepdims=False, out=None):
        return _kernel("mean")(self, axis, keepdims=keepdims, out=out)

    def var(self, axis=None, *, correction=0, ddof=None, keepdims=False, out=None):
        return _kernel("var")(self, axis, correction=correction, ddof=ddof, keepdims=keepdims,
                              out=out)

    def std(self, axis=None, *, correction=0, ddof=None, keepdims=False, out=None):
        return _kernel("std")(self, axis, correction=correction, ddof=ddof, keepdims=keepdims,
                              out=out)

    def max(self, axis=None, *, keepdims=False, out=None):
        return _kernel("max")(self, axis, keepdims=keepdims, out=out)

    def min(self, axis=None, *, keepdims=False, out=None):
        return _kernel("min")(self, axis, keepdims=keepdims, out=out)

    def argmax(self, axis=None, *, keepdims=False, out=None):
        return _kernel("argmax")(self, axis, keepdims=keepdims, out=out)

    def argmin(self, axis=None, *, keepdims=False, out=None):
        return _kernel("argmin")(self, axis, keepdims=keepdims, out=out)

    def any(self, axis=None, *, keepdims=False, out=None):
        return _kernel("any")(self, axis, keepdims=keepdims, out=out)

    def all(self, axis=None, *, keepdims=False, out=None):
        return _kernel("all")(self, axis, keepdims=keepdims, out=out)

    # -- host scalars: each is an explicit device-to-host copy of one element -------------
    def item(self):
        """Copy the single element to the host as a Python number.

        Returns
        -------
        int, float or bool
            The element (``numpy.ndarray.item``'s type for the dtype).

        Raises
        ------
        ValueError
            An array of more than one element, or of none.

        Examples
        --------
        >>> kaionb.asarray([[2.5]]).item()
        2.5
        """
        if self.size != 1:
            raise ValueError(f"DeviceArray.item: can only convert an array of size 1 to a "
                             f"Python scalar, got size {self.size}")
        return self.get().reshape(()).item()

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be used as an index, got dtype "
                            f"{self.dtype}")
        return int(self._scalar("index"))

    def _scalar(self, what: str):
        if self.size != 1:
            raise TypeError(f"{what}(): only arrays of size 1 can be converted to Python "
                            f"scalars, got size {self.size}")
        return self.item()

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d DeviceArray")
        return (self[i] for i in range(self.shape[0]))

    @property
    def flags(self) -> "Flags":
        """Contiguity, as NumPy's ``ndarray.flags`` names it.

        ``a.flags.c_contiguous`` or ``a.flags["C_CONTIGUOUS"]`` (also ``"C"``,
        ``"CONTIGUOUS"``), and the same for F (Fortran order).

        Examples
        --------
        >>> a = kaionb.zeros((2, 3))
        >>> a.flags.c_contiguous, a.T.flags["F_CONTIGUOUS"]
        (True, True)
        """
        return Flags(self.is_c_contiguous, self.transpose().is_c_contiguous)

    @property
    def mT(self) -> "DeviceArray":
        """The view with the last two axes swapped (the array API's matrix transpose).

        Raises ValueError for an array of fewer than 2 dimensions.

        Examples
        --------
        >>> kaionb.zeros((4, 2, 3)).mT.shape
        (4, 3, 2)
        """
        if self.ndim < 2:
            raise ValueError(f"mT: needs at least 2 dimensions, got {self.ndim}")
        axes = list(range(self.ndim))
        axes[-2], axes[-1] = axes[-1], axes[-2]
        return self.transpose(axes)

    def __array_namespace__(self, *, api_version=None):
        """The kaionb module: the Python array API namespace this array belongs to."""
        if api_version not in (None, "2023.12", "2022.12", "2021.12"):
            raise ValueError(f"__array_namespace__: api_version {api_version!r} is not "
                             f"supported (kaionb implements 2023.12)")
        import kaionb

        return kaionb

    # -- views --------------------------------------------------------------------------
    def _view(self, shape, strides, offset_bytes=0, dtype=None) -> "DeviceArray":
        return DeviceArray(tuple(shape), dtype or self.dtype, tuple(strides),
                           self.ptr + offset_bytes, self._owner, self.device_id)

    def transpose(self, *axes) -> "DeviceArray":
        """Return the view with the axes permuted, as ``numpy.ndarray.transpose``.

        Parameters
        ----------
        *axes : int or tuple of int
            The new order of the axes, as ints or one sequence; none reverses them.

        Returns
        -------
        DeviceArray
            A view of the same memory.

        Raises
        ------
        ValueError
            Axes that are not a permutation of the array's.

        Examples
        --------
        >>> kaionb.zeros((2, 3, 4)).transpose(1, 0, 2).shape
        (3, 2, 4)
        """
        return self._permuted(axes, "transpose")

    def _permuted(self, axes: tuple, where: str) -> "DeviceArray":
        """The view with axes in the order ``axes`` (ints, or one sequence of them; none:
        reversed); refusals name ``where`` (transpose or permute_dims)."""
        if not axes:  # x.transpose(): every axis reversed
            return self._view(self.shape[::-1], self.strides[::-1])
        if len(axes) == 1 and not isinstance(axes[0], (numbers.Integral, np.integer)):
            axes = tuple(axes[0])  # one sequence, which must name every axis (even ())
        axes = [_axis_index(where, a, self.ndim) for a in axes]
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"{where}: axes {tuple(axes)} are not a permutation of "
                             f"{tuple(range(self.ndim))}")
        return self._view([self.shape[a] for a in axes], [self.strides[a] for a in axes])

    def reshape(self, *shape) -> "DeviceArray":
        """Return the array with a new shape: a view when the layout allows, else a copy.

        A view when the memory layout allows it (as NumPy decides), else a C-contiguous
        copy.

        Parameters
        ----------
        *shape : int or tuple of int
            The new shape, as ints or one tuple; one entry may be -1 (inferred).

        Returns
        -------
        DeviceArray
            The reshaped array.

        Raises
        ------
        TypeError
            Shape entries that are not ints.
        ValueError
            A shape of another size, or more than one -1.

        Examples
        --------
        >>> a = kaionb.asarray(np.arange(6.0))
        >>> a.reshape(2, -1).get()
        array([[0., 1., 2.],
               [3., 4., 5.]])
        """
        if len(shape) == 1 and not isinstance(shape[0], (numbers.Integral, np.integer)):
            shape = tuple(shape[0])
        shape = list(shape)
        unknown = [i for i, d in enumerate(shape) if d == -1]
        if len(unknown) > 1:
            raise ValueError("reshape: only one dimension can be -1")
        if unknown:
            known = math.prod(d for d in shape if d != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"reshape: cannot reshape array of size {self.size} into "
                                 f"shape {tuple(shape)}")
            shape[unknown[0]] = self.size // known
        shape = normalize_shape(shape, "reshape")
        if math.prod(shape) != self.size:
            raise ValueError(f"reshape: cannot reshape array of size {self.size} into shape "
                             f"{shape}")
        if self.is_c_contiguous or self.size == 0:
            return self._view(shape, _contiguous_strides(shape, self.itemsize))
        strides = _reshape_strides(self.shape, self.strides, shape)
        if strides is None:  # the walk crosses axes that are not contiguous: copy
            return self.copy().reshape(shape)
        return self._view(shape, strides)

    def squeeze(self, axis=None) -> "DeviceArray":
        """Return the view without size-1 axes, as :func:`kaionb.squeeze`.

        Parameters
        ----------
        axis : int, tuple of int or None, optional
            The size-1 axes to remove; None removes all of them.

        Returns
        -------
        DeviceArray
            A view of the same memory.

        Raises
        ------
        ValueError
            An axis whose size is not 1.
        numpy.exceptions.AxisError
            An axis out of range.

        Examples
        --------
        >>> kaionb.zeros((1, 3, 1)).squeeze().shape
        (3,)
        """
        return squeeze(self, axis)

    def ravel(self) -> "DeviceArray":
        """Return the elements as a 1-D array: a view when contiguous, else a copy.

        As ``numpy.ravel``: C order.

        Returns
        -------
        DeviceArray
            The 1-D array.

        Examples
        --------
        >>> kaionb.asarray([[1, 2], [3, 4]]).T.ravel().get()
        array([1, 3, 2, 4])
        """
        return self.reshape(-1)

    def flatten(self) -> "DeviceArray":
        """Return a 1-D copy of the elements in C order.

        Returns
        -------
        DeviceArray
            A new C-contiguous 1-D array.

        Examples
        --------
        >>> kaionb.asarray([[1, 2], [3, 4]]).flatten().get()
        array([1, 2, 3, 4])
        """
        return self.copy().reshape(-1)

    def view(self, dtype) -> "DeviceArray":
        """Return the same bytes read as another dtype of the same itemsize.

        For example bfloat16 as uint16 (a view: no copy, no conversion).

        Parameters
        ----------
        dtype : dtype
            A dtype kaionb stores, of the array's itemsize.

        Returns
        -------
        DeviceArray
            A view of the same memory.

        Raises
        ------
        TypeError
            A dtype kaionb does not store.
        ValueError
            A dtype of another itemsize.

        Examples
        --------
        >>> kaionb.asarray([1.0], dtype=kaionb.bfloat16).view(np.uint16).get()
        array([16256], dtype=uint16)
        """
        dt = normalize_dtype(dtype, "DeviceArray.view")
        if dt.itemsize != self.itemsize:
            raise ValueError(f"DeviceArray.view: {dt} has itemsize {dt.itemsize}, the array's "
                             f"{self.dtype} has {self.itemsize}; only same-size views are allowed")
        return self._view(self.shape, self.strides, dtype=dt)

    def __getitem__(self, key) -> "DeviceArray":
        """Basic indexing (ints, slices with steps, ``...``, ``None``) is a view; an integer
        array or a boolean mask in the subscript gathers a copy (kaionb.kernels.indexing)."""
        if not isinstance(key, tuple):
            key = (key,)
        if any(_is_array_index(k) for k in key):
            return _kernel("take")(self, key)
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if sum(1 for k in key if k is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if n_real > self.ndim:
            raise IndexError(f"too many indices: array is {self.ndim}-dimensional, but "
                             f"{n_real} were indexed")
        expanded = []
        for k in key:
            if k is Ellipsis:
                expanded.extend([slice(None)] * (self.ndim - n_real))
            else:
                expanded.append(k)
        expanded.extend([slice(None)] * (self.ndim - sum(1 for k in expanded if k is not None)))
        shape, strides, offset, axis = [], [], 0, 0
        for k in expanded:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            dim, stride = self.shape[axis], self.strides[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(dim)
                length = len(range(start, stop, step))
                if length:
                    offset += start * stride
                shape.append(length)
                strides.append(stride * step)
            elif isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, bool):
                i = int(k)
                if not -dim <= i < dim:
                    raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim}")
                offset += (i % dim) * stride
            else:
                raise IndexError(f"DeviceArray supports basic indexing only (ints, slices, "
                                 f"..., None); got {type(k).__name__}")
            axis += 1
        return self._view(shape, strides, offset if math.prod(shape) else 0)

    def __setitem__(self, key, value) -> None:
        """``a[key] = value``: any subscript ``__getitem__`` takes; ``value`` a scalar or an
        array broadcast to the selection, converted to a's dtype (kaionb.kernels.indexing)."""
        _kernel("setitem")(self, key, value)

    # -- copies and conversion ------------------------------------------------------------
    def copy(self) -> "DeviceArray":
        """Return a C-contiguous copy on the array's device.

        Returns
        -------
        DeviceArray
            The copy (new memory).

        Examples
        --------
        >>> a = kaionb.zeros((2, 3))
        >>> b = a.T.copy()
        >>> b.is_c_contiguous, b.ptr != a.ptr
        (True, True)
        """
        with on_device(self.device_id):
            out = empty(self.shape, self.dtype)
            _copy_into(out, self)
        return out

    def astype(self, dtype) -> "DeviceArray":
        """Return a copy converted to ``dtype`` on the array's device.

        Float to half types (float16, bfloat16) rounds to nearest even; floats to integers
        truncate, as NumPy's ``astype``. Always a copy, even for the same dtype.

        Parameters
        ----------
        dtype : dtype
            A dtype kaionb stores.

        Returns
        -------
        DeviceArray
            A new C-contiguous array.

        Raises
        ------
        TypeError
            Something that is not a dtype, or a dtype kaionb does not store.

        Examples
        --------
        >>> kaionb.asarray([1.5, -2.7]).astype(np.int32).get()
        array([ 1, -2], dtype=int32)
        """
        dt = normalize_dtype(dtype, "astype")
        if dt == self.dtype:
            return self.copy()
        with on_device(self.device_id):
            out = empty(self.shape, dt)
            _copy_into(out, self)
        return out

    def to(self, device, *, stream=None) -> "DeviceArray":
        """Return this array on GPU ``device``: itself when it lives there, else a copy.

        The copy is C-contiguous, peer-to-peer where the GPUs allow it (through the host
        otherwise), ordered after the work queued on the source device's current stream
        and queued on the destination device's current stream.

        Parameters
        ----------
        device : int, kaionb.Device, torch.device or str
            The destination: an ordinal, a ``kaionb.Device``, a ``torch.device`` or
            ``"cuda:N"``.
        stream : stream-like, optional
            A stream of the destination device to queue the copy on instead.

        Returns
        -------
        DeviceArray
            The array on ``device``.

        Raises
        ------
        TypeError
            A ``device`` that names no device, or a ``stream`` that is not a stream.
        ValueError
            An ordinal no GPU has, or a stream of another device.

        Examples
        --------
        >>> a = kaionb.zeros(3)
        >>> a.to(0) is a
        True
        """
        ordinal = device_ordinal(device, "DeviceArray.to")
        if ordinal == self.device_id:
            return self
        src = self if self.is_c_contiguous else self.copy()  # (on the source device)
        with on_device(ordinal):
            target = (current_stream() if stream is None
                      else Stream.wrap(stream, "DeviceArray.to", "stream"))
            # allocated (and later freed) in the copy's stream order; a stream of another
            # device is refused
            with _device.stream(target):
                out = empty(self.shape, self.dtype)
                if out.size:
                    peer_copy(out.ptr, ordinal, target.handle, src.ptr, src.device_id,
                              out.nbytes)
        return out

    def to_device(self, device, /, *, stream=None) -> "DeviceArray":
        """Return this array on GPU ``device``: the array API's name for :meth:`to`.

        Parameters
        ----------
        device : int, kaionb.Device, torch.device or str
            The destination, as :meth:`to` takes it.
        stream : stream-like, optional
            A stream of the destination device to queue the copy on instead.

        Returns
        -------
        DeviceArray
            The array on ``device`` (itself when it lives there).

        Raises
        ------
        TypeError, ValueError
            As :meth:`to`.

        Examples
        --------
        >>> a = kaionb.zeros(3)
        >>> a.to_device(0).device
        0
        """
        return self.to(device, stream=stream)

    def fill(self, value) -> "DeviceArray":
        """Set every element to ``value``, in place.

        A contiguous array is filled with one stream-ordered memset of the value's bits;
        other layouts through a converting copy.

        Parameters
        ----------
        value : scalar
            The value, converted to the array's dtype (as NumPy's unsafe cast).

        Returns
        -------
        DeviceArray
            The array itself.

        Raises
        ------
        ValueError
            A value NumPy cannot convert to the dtype (a non-numeric string).

        Examples
        --------
        >>> kaionb.empty(3, np.int32).fill(7).get()
        array([7, 7, 7], dtype=int32)
        """
        if self.size == 0:
            return self
        with on_device(self.device_id):
            if self.is_c_contiguous:
                _memset(self, np.asarray(value).astype(self.dtype, casting="unsafe"))
            else:
                _copy_into(self, full(self.shape, value, self.dtype))
        return self

    def get(self, stream=None) -> np.ndarray:
        """Copy the array to a new NumPy array on the host.

        The copy runs on ``stream`` (default: the current stream of the array's device) and
        this call waits for it; a non-contiguous array is made contiguous on the device
        first.

        Parameters
        ----------
        stream : stream-like, optional
            The stream to copy on (any stream-like object).

        Returns
        -------
        numpy.ndarray
            The elements, C-contiguous, in the array's dtype.

        Raises
        ------
        RuntimeError
            While the stream captures a CUDA graph (a host copy would wait for the GPU).

        Examples
        --------
        >>> kaionb.asarray([1, 2, 3]).get()
        array([1, 2, 3])
        """
        host = np.empty(self.shape, self.dtype)
        if not self.size:
            return host
        with on_device(self.device_id):
            handle = (current_stream().handle if stream is None
                      else Stream.wrap(stream, "DeviceArray.get", "stream").handle)
            _refuse_in_capture("DeviceArray.get", handle)
            src = self if self.is_c_contiguous else self.copy()
            from cuda.bindings import driver

            (err,) = driver.cuMemcpyDtoHAsync(host.ctypes.data, src.ptr, self.nbytes, handle)
            check_driver(err, "DeviceArray.get: cuMemcpyDtoHAsync")
            (err,) = driver.cuStreamSynchronize(handle)
            check_driver(err, "DeviceArray.get: cuStreamSynchronize")
        return host

    # -- export ---------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        if self.dtype == bfloat16:
            # CAI has no bfloat16 typestr ('<V2' would be read as raw bytes).
            raise AttributeError("bfloat16 has no CUDA Array Interface type: use DLPack "
                                 "(__dlpack__) or .view(numpy.uint16)")
        handle = stream_of(self.device_id).handle
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None if self.is_c_contiguous else self.strides,
            "version": 3,
            # CAI v3: 1 is the legacy default stream; 0 is not allowed.
            "stream": handle if handle else 1,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CUDA, self.device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export as a DLPack capsule; work pending on kaionb's stream is ordered before
        ``stream`` (the consumer's) — DLPack: None = legacy default, -1 = no sync."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"DeviceArray.__dlpack__: cannot export to device {dl_device}")
        if copy:
            return self.copy().__dlpack__(stream=stream, max_version=max_version)
        if stream != -1:
            # None and 1 name the legacy default stream (handle 0); 2 is the per-thread
            # default stream, whose handle is CU_STREAM_PER_THREAD == 2.
            consumer = 0 if stream in (None, 1) else int(stream)
            with on_device(self.device_id):
                _order_streams(current_stream().handle, consumer)
        if self.dtype == bfloat16:
            # cuda.core's exporter has no bfloat16: export the bits as uint16, then set the
            # DLPack type code to kDLBfloat (same size, same lanes).
            capsule = self.view(np.uint16)._memory_view().__dlpack__(
                stream=-1, max_version=max_version)
            _set_dlpack_type_code(capsule, _DL_UINT, _DL_BFLOAT)
            return capsule
        return self._memory_view().__dlpack__(stream=-1, max_version=max_version)

    def _memory_view(self):
        from cuda.core import Buffer
        from cuda.core.utils import StridedMemoryView

        # Size of the span the view touches (non-negative strides: a view's ptr is its start).
        span = (1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides))) * \
            self.itemsize if self.size else 0
        buf = Buffer.from_handle(self.ptr, max(span, self.itemsize), owner=self)
        elem_strides = tuple(s // self.itemsize for s in self.strides)
        return StridedMemoryView.from_buffer(buf, self.shape, elem_strides, dtype=self.dtype)


_DL_UINT, _DL_BFLOAT = 1, 4  # DLDataTypeCode values (dlpack.h)


def _set_dlpack_type_code(capsule, expected: int, new: int) -> None:
    """Rewrite the dtype code of the DLTensor inside an unconsumed DLPack capsule.

    Layout (dlpack.h): DLManagedTensorVersioned = {version u32×2, manager_ctx, deleter, flags
    u64, DLTensor} puts the DLTensor at byte 32; the legacy DLManagedTensor starts with it.
    In DLTensor = {data, DLDevice (i32×2), ndim i32, DLDataType {code u8, bits u8, lanes
    u16}, ...} the code byte is at offset 20.
    """
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(capsule)
    tensor = api.PyCapsule_GetPointer(capsule, name) + (32 if name == b"dltensor_versioned"
                                                         else 0)
    code = ctypes.c_uint8.from_address(tensor + 20)
    if code.value != expected:
        raise BufferError(f"unexpected DLPack dtype code {code.value} (expected {expected})")
    code.value = new


def _order_streams(producer: int, consumer: int) -> None:
    """Make ``consumer`` wait for the work queued so far on ``producer``."""
    if producer == consumer:
        return
    from cuda.bindings import driver

    err, event = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    check_driver(err, "cuEventCreate")
    try:
        (err,) = driver.cuEventRecord(event, producer)
        check_driver(err, "cuEventRecord")
        (err,) = driver.cuStreamWaitEvent(consumer, event, 0)
        check_driver(err, "cuStreamWaitEvent")
    finally:
        driver.cuEventDestroy(event)


# -- creation --------------------------------------------------------------------------------

def empty(shape, dtype=np.float64, *, device=None) -> DeviceArray:
    """Return a new C-contiguous array of uninitialised device memory.

    Memory comes from the stream-ordered allocator of ``device`` (default: the current
    device), on its current stream; while that stream captures a CUDA graph, from the
    graph's own memory (an allocation node, freed when the array dies). A zero-size shape
    allocates nothing.

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    dtype : dtype, optional
        A dtype kaionb stores; float64 by default, as NumPy's.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device`` or ``"cuda:N"``.

    Returns
    -------
    DeviceArray
        The new array (its elements are whatever the memory held).

    Raises
    ------
    TypeError
        A shape that is not an int or a tuple of ints, a dtype kaionb does not store, or a
        ``device`` that names no device.
    ValueError
        A negative shape entry, or an ordinal no GPU has.

    Examples
    --------
    >>> a = kaionb.empty((2, 3), np.float32)
    >>> a.shape, a.dtype
    ((2, 3), dtype('float32'))
    """
    return _on_device_of(device, "empty", _empty, shape, dtype)


def _on_device_of(device, where: str, make, *args):
    """``make(*args)`` with ``device`` (None: the current one) and its context current;
    with one GPU and no device named, directly (nothing to choose: the hot path)."""
    if device is None and not _device._MULTI_GPU:
        return make(*args)
    token = enter_device(current_ordinal() if device is None else
                         device_ordinal(device, where))
    try:
        return make(*args)
    finally:
        leave_device(token)


def _empty(shape, dtype, where: str = "empty") -> DeviceArray:
    """:func:`empty` on the current device, its context current; refusals name ``where``
    (the creation function called)."""
    shape = normalize_shape(shape, where)
    dt = normalize_dtype(dtype, where)
    nbytes = math.prod(shape) * dt.itemsize
    strides = _contiguous_strides(shape, dt.itemsize)
    if nbytes == 0:
        out = DeviceArray(shape, dt, strides, 0, None, STATE.ordinal)
    else:
        out = _new(shape, dt, strides, nbytes)
    if STATE.recorder is not None:
        STATE.recorder.allocated(out)
    return out


def _new(shape: tuple, dt: np.dtype, strides: tuple, nbytes: int) -> DeviceArray:
    """A new C-contiguous array of an already checked shape and dtype (``empty``'s
    work, less the checks: the replay of a recorded call allocates with it)."""
    owner, device_id = _allocate(nbytes)
    return DeviceArray(shape, dt, strides, int(owner.handle), owner, device_id)


def _allocate(nbytes: int):
    """(the owner of ``nbytes`` of new memory on the current stream — a cuda.core Buffer,
    or for a small allocation on the legacy default stream a reused
    :class:`~kaionb._block_cache.Block` — the device ordinal).

    cuda.core's pool refuses a capturing stream; there the graph memory resource
    allocates instead: the memory belongs to the graph (an allocation node), freed by a
    free node when the array dies during the capture, else when it dies after (graphs
    that kaionb.graph() makes also free it before each relaunch)."""
    memory_resource, device_id = current_allocator()
    stream = current_stream()
    if nbytes <= _block_cache.SMALL_BYTES and stream.handle == _block_cache.CACHED_STREAM:
        return _block_cache.allocate(memory_resource, device_id, stream, nbytes), device_id
    try:
        return memory_resource.allocate(nbytes, stream=allocation_stream(device_id, stream)), \
            device_id
    except RuntimeError:
        if not is_capturing(stream.handle):
            raise
    return graph_allocator().allocate(nbytes, stream=stream.as_core()), device_id


def zeros(shape, dtype=np.float64, *, device=None) -> DeviceArray:
    """Return a new C-contiguous array filled with zeros.

    One stream-ordered memset on the current stream of ``device`` (default: the current
    device).

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    dtype : dtype, optional
        A dtype kaionb stores; float64 by default, as NumPy's.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device`` or ``"cuda:N"``.

    Returns
    -------
    DeviceArray
        The new array of zeros.

    Raises
    ------
    TypeError
        A shape that is not an int or a tuple of ints, a dtype kaionb does not store, or a
        ``device`` that names no device.
    ValueError
        A negative shape entry, or an ordinal no GPU has.

    Examples
    --------
    >>> kaionb.zeros((2, 2)).get()
    array([[0., 0.],
           [0., 0.]])
    """
    return _on_device_of(device, "zeros", _zeros, shape, dtype)


def _zeros(shape, dtype, where: str = "zeros") -> DeviceArray:
    """:func:`zeros` on the current device, its context current; refusals name ``where``."""
    out = _empty(shape, dtype, where)
    if out.size:
        from cuda.bindings import driver

        (err,) = driver.cuMemsetD8Async(out.ptr, 0, out.nbytes, current_stream().handle)
        check_driver(err, "zeros: cuMemsetD8Async")
        if STATE.recorder is not None:
            STATE.recorder.zeroed(out)
    return out


def _refuse_in_capture(where: str, handle: int) -> None:
    """A host transfer waits for the GPU, which a capturing stream cannot do (the driver
    would invalidate the capture): a clear error instead, before anything is queued."""
    if is_capturing(handle):
        raise RuntimeError(f"{where}: copying between host and device waits for the GPU, "
                           "which a stream capturing a CUDA graph cannot do; do it before "
                           "or after the capture")


def full(shape, fill_value, dtype=None, *, device=None) -> DeviceArray:
    """Return a new C-contiguous array with every element ``fill_value``.

    Made on ``device`` (default: the current one) and filled on the device (a memset of
    the value's bits).

    Parameters
    ----------
    shape : int or tuple of int
        The shape.
    fill_value : scalar
        The value of every element, converted to ``dtype``.
    dtype : dtype, optional
        A dtype kaionb stores; by default NumPy's for the value
        (``np.asarray(fill_value).dtype``: int64 for an int, float64 for a float).
    device : int, kaionb.Device, torch.device or str, optional
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device`` or ``"cuda:N"``.

    Returns
    -------
    DeviceArray
        The new array.

    Raises
    ------
    TypeError
        A shape that is not an int or a tuple of ints, a dtype kaionb does not store (a
        string value's included), or a ``device`` that names no device.
    ValueError
        A negative shape entry, or an ordinal no GPU has.

    Examples
    --------
    >>> kaionb.full((3,), 7).get()
    array([7, 7, 7])
    >>> kaionb.full((2,), 0.5, np.float32).get()
    array([0.5, 0.5], dtype=float32)
    """
    return _full("full", shape, fill_value, dtype, device)


def _full(where: str, shape, fill_value, dtype, device) -> DeviceArray:
    """:func:`full` for the creation function ``where`` (ones, full_like, ...), which its
    refusals name."""
    dtype = np.asarray(fill_value).dtype if dtype is None else dtype
    return _on_device_of(device, where, _empty, shape, dtype, where).fill(fill_value)


def empty_like(a, dtype=None, *, device=None) -> DeviceArray:
    """Return a new uninitialised array with the shape, dtype and device of ``a``.

    :func:`empty` with ``a``'s shape, dtype (unless ``dtype`` is given) and device
    (unless ``device`` is given).

    Parameters
    ----------
    a : DeviceArray
        The array whose shape (and dtype, device) to take.
    dtype : dtype, optional
        The dtype instead of ``a``'s.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU instead of ``a``'s.

    Returns
    -------
    DeviceArray
        The new array (its elements are whatever the memory held).

    Raises
    ------
    TypeError
        A dtype kaionb does not store, or a ``device`` that names no device.
    ValueError
        An ordinal no GPU has.

    Examples
    --------
    >>> a = kaionb.zeros((2, 3), np.float16)
    >>> b = kaionb.empty_like(a)
    >>> b.shape, b.dtype
    ((2, 3), dtype('float16'))
    """
    return _on_device_of(a.device_id if device is None else device, "empty_like", _empty,
                         a.shape, a.dtype if dtype is None else dtype, "empty_like")


def zeros_like(a, dtype=None, *, device=None) -> DeviceArray:
    """Return a new array of zeros with the shape, dtype and device of ``a``.

    :func:`zeros` with ``a``'s shape, dtype (unless ``dtype`` is given) and device
    (unless ``device`` is given).

    Parameters
    ----------
    a : DeviceArray
        The array whose shape (and dtype, device) to take.
    dtype : dtype, optional
        The dtype instead of ``a``'s.
    device : int, kaionb.Device, torch.device or str, optional
        The GPU instead of ``a``'s.

    Returns
    -------
    DeviceArray
        The new array of zeros.

    Raises
    ------
    TypeError
        A dtype kaionb does not store, or a ``device`` that names no device.
    ValueError
        An ordinal no GPU has.

    Examples
    --------
    >>> a = kaionb.asarray([[1, 2], [3, 4]])
    >>> kaionb.zeros_like(a).get()
    array([[0, 0],
           [0, 0]])
    """
    return _on_device_of(a.device_id if device is None else device, "zeros_like", _zeros,
                         a.shape, a.dtype if dtype is None else dtype, "zeros_like")


def asarray(obj, dtype=None, *, device=None, copy=None) -> DeviceArray:
    """Return ``obj`` as a DeviceArray: zero-copy for GPU memory, a copy for host data.

    - DeviceArray: returned as is (converted on the device if ``dtype`` differs).
    - GPU memory of another library (``__dlpack__`` or ``__cuda_array_interface__``: CuPy,
      PyTorch, numba, JAX): zero-copy, ordered after the producer's stream.
    - NumPy arrays, Python scalars and sequences: copied to the device (``device``, else
      the current one).
    - Host memory of other libraries (a CPU torch tensor, ...): refused unless ``copy=True``.

    GPU memory on another device than ``device`` is copied there (``copy=False``: a
    ValueError instead).

    Parameters
    ----------
    obj : DeviceArray, array_like or GPU array of another library
        What to convert.
    dtype : dtype, optional
        The dtype of the result (converted on the device when it differs).
    device : int, kaionb.Device, torch.device or str, optional
        The GPU: an ordinal, a ``kaionb.Device``, a ``torch.device`` or ``"cuda:N"``.
    copy : bool, optional
        True: always copy. False: never copy (raise instead). None: copy only when needed.

    Returns
    -------
    DeviceArray
        The array (``obj`` itself for a DeviceArray that needs no conversion).

    Raises
    ------
    TypeError
        Data NumPy cannot convert, or of a dtype kaionb does not store (strings, objects,
        complex), or a ``device`` that names no device.
    ValueError
        ``copy=False`` where a copy is needed (host data, another device), host memory of
        another library without ``copy=True``, memory of a non-CUDA device, or an ordinal
        no GPU has.

    Examples
    --------
    >>> x = kaionb.asarray(np.arange(3.0))
    >>> x.get()
    array([0., 1., 2.])
    >>> kaionb.asarray([1, 2], dtype=np.float32).dtype
    dtype('float32')
    """
    ordinal = None if device is None else device_ordinal(device, "asarray")
    if isinstance(obj, DeviceArray):
        out = obj
    elif isinstance(obj, np.ndarray) or not (hasattr(obj, "__dlpack__")
                                             or hasattr(obj, "__cuda_array_interface__")):
        if copy is False:
            raise ValueError("asarray: a host (NumPy) array needs a copy to reach the GPU, "
                             "but copy=False was given")
        return _on_device_of(ordinal, "asarray", _from_host, obj, dtype)
    else:
        out = _from_foreign(obj, copy=copy)
    if ordinal is not None and out.device_id != ordinal:
        if copy is False:
            raise ValueError(f"asarray: argument 'device' expected the device of the "
                             f"array (device {out.device_id}) with copy=False, got device "
                             f"{ordinal}")
        moved = out.to(ordinal)
        return moved if dtype is None else moved.astype(dtype)
    if dtype is not None and normalize_dtype(dtype, "asarray") != out.dtype:
        out = out.astype(dtype)
    elif copy and out is obj:
        out = out.copy()
    return out


def from_dlpack(obj) -> DeviceArray:
    """Import a CUDA-resident DLPack producer zero-copy.

    A capsule alone is not accepted: DLPack's stream hand-off needs the producer object
    (a torch tensor, a CuPy or JAX array, a DeviceArray). The result views the
    producer's memory and keeps the producer alive.

    Parameters
    ----------
    obj : object
        An object with ``__dlpack__`` whose memory is on a CUDA device.

    Returns
    -------
    DeviceArray
        A view of ``obj``'s memory.

    Raises
    ------
    TypeError
        An object without ``__dlpack__``, or one whose dtype kaionb does not store.
    ValueError
        Host memory, or memory of a non-CUDA device.

    Examples
    --------
    >>> x = kaionb.asarray([1.0, 2.0])
    >>> y = kaionb.from_dlpack(x)    # any __dlpack__ producer: torch, CuPy, JAX
    >>> y.ptr == x.ptr
    True
    """
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__, got "
                        f"{type(obj).__name__}")
    return _from_foreign(obj, copy=False, where="from_dlpack")


def _from_host(obj, dtype) -> DeviceArray:
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "OUSVcM" and obj.dtype != bfloat16:
        raise TypeError(f"asarray: dtype {obj.dtype} is not supported")
    try:
        host = np.asarray(obj, dtype=None if dtype is None else normalize_dtype(dtype, "asarray"))
    except (ValueError, TypeError) as exc:
        raise TypeError(f"asarray: cannot convert {type(obj).__name__} to an array: {exc}") \
            from None
    normalize_dtype(host.dtype, "asarray")
    if not host.flags.c_contiguous:
        host = host.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    handle = current_stream().handle
    if host.size:
        _refuse_in_capture("asarray", handle)
    out = empty(host.shape, host.dtype)
    if out.size:
        from cuda.bindings import driver

        (err,) = driver.cuMemcpyHtoDAsync(out.ptr, host.ctypes.data, out.nbytes, handle)
        check_driver(err, "asarray: cuMemcpyHtoDAsync")
        # The source is pageable host memory owned by Python: finish before it can go away.
        (err,) = driver.cuStreamSynchronize(handle)
        check_driver(err, "asarray: cuStreamSynchronize")
    return out


def _from_foreign(obj, *, copy, where: str = "asarray") -> DeviceArray:
    """Another library's array, zero-copy (host memory: a copy, where ``copy``); refusals
    name ``where`` (asarray or from_dlpack)."""
    from cuda.core.utils import StridedMemoryView

    if hasattr(obj, "__dlpack_device__"):
        kind, ordinal = obj.__dlpack_device__()
        if kind in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
            if not copy:
                # (advice that holds for asarray, from_dlpack and an op's argument alike)
                raise ValueError(f"{where}: {type(obj).__name__} lives in host memory "
                                 f"({_DLPACK_DEVICE_NAMES[int(kind)]}); kaionb.asarray(x, "
                                 f"copy=True) copies it to the GPU")
            return _from_host(np.from_dlpack(obj), None)
        if kind not in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
            raise ValueError(f"{where}: {type(obj).__name__} is on a "
                             f"{_DLPACK_DEVICE_NAMES.get(int(kind), f'type-{int(kind)}')} device; "
                             f"kaionb needs CUDA device memory")
        if kind in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED) and int(ordinal) != STATE.ordinal:
            # the producer's stream hand-off targets a stream of the memory's own device
            with on_device(device_ordinal(int(ordinal), where)):
                return _from_foreign(obj, copy=copy, where=where)
    current_device()
    try:
        view = StridedMemoryView.from_any_interface(obj, stream_ptr=current_stream().handle)
    except (BufferError, NotImplementedError) as exc:
        raise TypeError(f"{where}: cannot import {type(obj).__name__}: {exc}") from None
    if not view.is_device_accessible or view.device_id < 0:
        raise ValueError(f"{where}: {type(obj).__name__} is not in CUDA device memory")
    dt = normalize_dtype(view.dtype, where)
    shape = tuple(int(d) for d in view.shape)
    if view.strides is None:
        strides = _contiguous_strides(shape, dt.itemsize)
    else:
        strides = tuple(int(s) * dt.itemsize for s in view.strides)
    return DeviceArray(shape, dt, strides, int(view.ptr), view, view.device_id)


# -- views: shape functions that never copy ---------------------------------------------------

def _axis_index(op: str, axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (numbers.Integral, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(f"{op}: axis {axis} is out of bounds for array of "
                                      f"dimension {ndim}")
    return int(axis) % ndim


def _axis_set(op: str, axis, ndim: int) -> set:
    """An int or a tuple of them as a set of axes in range; a repeated one is refused, as
    NumPy does."""
    axes = [_axis_index(op, a, ndim) for a in (axis if isinstance(axis, tuple) else (axis,))]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{op}: repeated axis in {axis}")
    return set(axes)


def broadcast_to(x: DeviceArray, /, shape) -> DeviceArray:
    """Return a view of ``x`` broadcast to ``shape``, as ``np.broadcast_to``.

    Stride 0 along stretched and new axes; read-only by convention (writing through it
    writes the same element several times).

    Parameters
    ----------
    x : DeviceArray
        The array.
    shape : int or tuple of int
        The shape to broadcast to.

    Returns
    -------
    DeviceArray
        A view of ``x``'s memory.

    Raises
    ------
    TypeError
        A shape that is not an int or a tuple of ints.
    ValueError
        A shape ``x`` does not broadcast to.

    Examples
    --------
    >>> x = kaionb.asarray([1, 2, 3])
    >>> kaionb.broadcast_to(x, (2, 3)).strides
    (0, 8)
    """
    shape = normalize_shape(shape, "broadcast_to")
    pad = len(shape) - x.ndim
    if pad < 0 or any(d != n and d != 1 for d, n in zip(x.shape, shape[pad:])):
        raise ValueError(f"broadcast_to: operands could not be broadcast together with "
                         f"remapped shapes [original->remapped]: {x.shape} and requested "
                         f"shape {shape}")
    strides = (0,) * pad + tuple(0 if d != n else s
                                 for d, n, s in zip(x.shape, shape[pad:], x.strides))
    return x._view(shape, strides)


def expand_dims(x: DeviceArray, /, axis=0) -> DeviceArray:
    """Return a view of ``x`` with a new size-1 axis at ``axis``.

    Parameters
    ----------
    x : DeviceArray
        The array.
    axis : int, optional
        Where the new axis is, in the result's axes (negative counts from the end).

    Returns
    -------
    DeviceArray
        A view of ``x``'s memory.

    Raises
    ------
    TypeError
        An axis that is not an int.
    numpy.exceptions.AxisError
        An axis out of range of the result's dimensions.

    Examples
    --------
    >>> kaionb.expand_dims(kaionb.zeros((2, 3)), axis=-1).shape
    (2, 3, 1)
    """
    axis = _axis_index("expand_dims", axis, x.ndim + 1)
    return x._view(x.shape[:axis] + (1,) + x.shape[axis:],
                   x.strides[:axis] + (0,) + x.strides[axis:])


def squeeze(x: DeviceArray, /, axis=None) -> DeviceArray:
    """Return a view of ``x`` without size-1 axes.

    Parameters
    ----------
    x : DeviceArray
        The array.
    axis : int, tuple of int or None, optional
        The size-1 axes to remove; None removes all of them.

    Returns
    -------
    DeviceArray
        A view of ``x``'s memory.

    Raises
    ------
    TypeError
        An axis that is not an int.
    ValueError
        An axis whose size is not 1, or an axis given twice.
    numpy.exceptions.AxisError
        An axis out of range.

    Examples
    --------
    >>> kaionb.squeeze(kaionb.zeros((1, 3, 1)), axis=0).shape
    (3, 1)
    """
    if axis is None:
        axes = {i for i, d in enumerate(x.shape) if d == 1}
    else:
        axes = _axis_set("squeeze", axis, x.ndim)
        for a in sorted(axes):
            if x.shape[a] != 1:
                raise ValueError(f"squeeze: cannot select an axis to squeeze out which has "
                                 f"size not equal to one (axis {a} has size {x.shape[a]})")
    keep = [i for i in range(x.ndim) if i not in axes]
    return x._view([x.shape[i] for i in keep], [x.strides[i] for i in keep])


def flip(x: DeviceArray, /, *, axis=None) -> DeviceArray:
    """Return a view of ``x`` with the order of elements along ``axis`` reversed.

    Parameters
    ----------
    x : DeviceArray
        The array.
    axis : int, tuple of int or None, optional
        The axes to reverse; None reverses every axis.

    Returns
    -------
    DeviceArray
        A view of ``x``'s memory (negative strides).

    Raises
    ------
    TypeError
        An axis that is not an int.
    ValueError
        An axis given twice.
    numpy.exceptions.AxisError
        An axis out of range.

    Examples
    --------
    >>> kaionb.flip(kaionb.asarray([1, 2, 3])).get()
    array([3, 2, 1])
    """
    axes = range(x.ndim) if axis is None else _axis_set("flip", axis, x.ndim)
    key = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))
    return x[key]


def moveaxis(x: DeviceArray, source, destination, /) -> DeviceArray:
    """Return a view of ``x`` with axes ``source`` moved to ``destination``.

    The other axes keep their order, as ``np.moveaxis``.

    Parameters
    ----------
    x : DeviceArray
        The array.
    source, destination : int or tuple of int
        The axes to move and where they go (the same number of each).

    Returns
    -------
    DeviceArray
        A view of ``x``'s memory.

    Raises
    ------
    TypeError
        An axis that is not an int.
    ValueError
        ``source`` and ``destination`` of different lengths, or a repeated axis.
    numpy.exceptions.AxisError
        An axis out of range.

    Examples
    --------
    >>> kaionb.moveaxis(kaionb.zeros((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    src = source if isinstance(source, tuple) else (source,)
    dst = destination if isinstance(destination, tuple) else (destination,)
    if len(src) != len(dst):
        raise ValueError("moveaxis: `source` and `destination` arguments must have the same "
                         "number of elements")
    src = [_axis_index("moveaxis", a, x.ndim) for a in src]
    dst = [_axis_index("moveaxis", a, x.ndim) for a in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError("moveaxis: repeated axis")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return x.transpose(order)


def permute_dims(x: DeviceArray, /, axes) -> DeviceArray:
    """Return a view of ``x`` with its axes permuted: the array API's ``x.transpose(axes)``.

    Parameters
    ----------
    x : DeviceArray
        The array.
    axes : tuple of int
        The new order of the axes.

    Returns
    -------
    DeviceArray
        A view of ``x``'s memory.

    Raises
    ------
    ValueError
        Axes that are not a permutation of ``x``'s.

    Examples
    --------
    >>> kaionb.permute_dims(kaionb.zeros((2, 3, 4)), (2, 0, 1)).shape
    (4, 2, 3)
    """
    return x._permuted((axes,), "permute_dims")


def reshape(x: DeviceArray, /, shape, *, copy=None) -> DeviceArray:
    """Return ``x`` with a new shape: ``x.reshape(shape)``, a view when the layout allows.

    A view when the memory layout allows it (as NumPy decides), else a C-contiguous copy.

    Parameters
    ----------
    x : DeviceArray
        The array.
    shape : int or tuple of int
        The new shape; one entry may be -1 (inferred).
    copy : bool, optional
        True: always copy. False: refuse a copy (ValueError). None: copy only when needed.

    Returns
    -------
    DeviceArray
        The reshaped array.

    Raises
    ------
    TypeError
        Shape entries that are not ints.
    ValueError
        A shape of another size, more than one -1, or ``copy=False`` for a layout that
        needs a copy.

    Examples
    --------
    >>> kaionb.reshape(kaionb.asarray(np.arange(4)), (2, 2)).get()
    array([[0, 1],
           [2, 3]])
    """
    if copy:
        return x.copy().reshape(shape)
    if copy is False and not x.is_c_contiguous and x.size > 1:
        raise ValueError(f"reshape: cannot reshape an array of shape {x.shape} and strides "
                         f"{x.strides} without a copy (copy=False)")
    return x.reshape(shape)


# -- the kernels DeviceArray uses ------------------------------------------------------------
#
# Every kernel module imports this one, so this one never imports them: the few kernels a
# DeviceArray method needs register themselves here when their module is imported
# (kaionb/__init__ imports them all).

KERNEL_HOOKS = (
    "copy_convert", "matmul",  # converting/strided copies; ``a @ b``
    "elementwise", "take", "setitem",  # operators, integer/boolean indexing
    "sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "any", "all",
)
_HOOKED: dict = {}


def register_kernel(name: str, fn) -> None:
    """Called once by the kernel module that defines ``name`` (one of KERNEL_HOOKS)."""
    if name not in KERNEL_HOOKS:
        raise ValueError(f"register_kernel: {name!r} is not one of {KERNEL_HOOKS}")
    _HOOKED[name] = fn


def _kernel(name: str):
    fn = _HOOKED.get(name)
    if fn is None:
        raise RuntimeError(f"DeviceArray needs the {name!r} kernel, which no kaionb.kernels "
                           f"module has registered: import kaionb (it loads every kernel)")
    return fn


# -- device-side copies ------------------------------------------------------------------------

def _copy_into(dst: DeviceArray, src: DeviceArray) -> None:
    """dst[...] = src (same shape), converting dtype and following strides on the device."""
    if dst.size == 0:
        return
    if dst.dtype == src.dtype and dst.is_c_contiguous and src.is_c_contiguous:
        from cuda.bindings import driver

        if STATE.recorder is not None:
            STATE.recorder.unrecordable("a device-to-device copy")

        (err,) = driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, dst.nbytes, current_stream().handle)
        check_driver(err, "cuMemcpyDtoDAsync")
        return
    _kernel("copy_convert")(src, dst)


def _memset(a: DeviceArray, value: np.ndarray) -> None:
    """Fill a contiguous array with one element's bit pattern using the driver's memset."""
    from cuda.bindings import driver

    if STATE.recorder is not None:
        STATE.recorder.unrecordable("a fill")
    bits = value.reshape(1).view({1: np.uint8, 2: np.uint16, 4: np.uint32,
                                  8: np.uint32}[a.itemsize])
    handle = current_stream().handle
    if a.itemsize == 1:
        (err,) = driver.cuMemsetD8Async(a.ptr, int(bits[0]), a.size, handle)
    elif a.itemsize == 2:
        (err,) = driver.cuMemsetD16Async(a.ptr, int(bits[0]), a.size, handle)
    elif a.itemsize == 4:
        (err,) = driver.cuMemsetD32Async(a.ptr, int(bits[0]), a.size, handle)
    else:  # 8-byte elements: low and high words as two pitched 32-bit fills
        for half in (0, 1):
            (err,) = driver.cuMemsetD2D32Async(a.ptr + 4 * half, 8, int(bits[half]), 1, a.size,
                                               handle)
            check_driver(err, "fill: cuMemsetD2D32Async")
    check_driver(err, "fill: cuMemset")
