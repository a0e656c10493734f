"""The on-disk cache of what kaionb makes from a kernel: numba → PTX costs seconds per
specialization, so a process that finds the result here never calls numba's compiler.

Storage is cuda.core's ``FileStreamProgramCache``: writes go to a temporary file that
``os.replace`` moves into place (a reader sees the old entry or the new one, never part of
one), safe across processes, with a soft size bound that evicts the least recently read
entries first. Two things it leaves to us:

- The key. ``make_program_cache_key`` hashes a Program's input code (PTX or C++), and the
  PTX is exactly what a cache hit must not have to produce. :func:`kernel_key` hashes what
  numba's output depends on instead: the package's source, the kernel's identity and
  compile-time constants, signature, architecture, options and the compilers' versions.
- Integrity. The cache stores bytes unchecked, and a launch needs the entry name next to
  the cubin. Each entry is a record: a magic line, the SHA-256 of the body, then
  length-prefixed fields. A record that fails the check counts as a miss (recompile, and
  the new record replaces it). The price: entries are not raw cubins for cuobjdump.

``KAIONB_CACHE_DIR`` (default ``~/.cache/kaionb``) moves it, ``KAIONB_CACHE_MAX_BYTES``
(default 2 GiB) bounds it, ``KAIONB_DISABLE_CACHE=1`` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from pathlib import Path

DEFAULT_MAX_BYTES = 2 << 30

_MAGIC = b"kaionb record 1\n"
_DIGEST_BYTES = 32
_LENGTH = struct.Struct("<Q")


def program_cache():
    """This process's cache (a ``FileStreamProgramCache``), or None when it is turned off or
    its directory cannot be created."""
    if os.environ.get("KAIONB_DISABLE_CACHE"):
        return None
    root = os.environ.get("KAIONB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kaionb")
    limit = os.environ.get("KAIONB_CACHE_MAX_BYTES") or DEFAULT_MAX_BYTES
    try:
        max_bytes = int(limit)
    except ValueError:
        raise ValueError(f"KAIONB_CACHE_MAX_BYTES: expected a number of bytes, got {limit!r}") \
            from None
    return _open(root, max_bytes)


@functools.lru_cache(maxsize=None)
def _open(root: str, max_bytes: int):
    # One instance per directory: opening scans every entry to seed the size tracker.
    from cuda.core.utils import FileStreamProgramCache

    try:
        return FileStreamProgramCache(root, max_size_bytes=max_bytes)
    except OSError:
        return None  # a read-only home only costs recompiles


def load(key: str) -> list[bytes] | None:
    """The fields stored under ``key``; None on a miss or a record that fails its check."""
    cache = program_cache()
    if cache is None:
        return None
    try:
        record = cache.get(key)
    except OSError:
        return None
    return None if record is None else _unpack(record)


def store(key: str, fields: list[bytes]) -> None:
    """Store ``fields`` under ``key``; a failed write only costs a recompile later."""
    cache = program_cache()
    if cache is None:
        return
    try:
        cache[key] = _pack(fields)
    except OSError:
        pass


def _pack(fields: list[bytes]) -> bytes:
    body = b"".join(_LENGTH.pack(len(f)) + f for f in fields)
    return _MAGIC + hashlib.sha256(body).digest() + body


def _unpack(record: bytes) -> list[bytes] | None:
    start = len(_MAGIC) + _DIGEST_BYTES
    if (not record.startswith(_MAGIC)
            or hashlib.sha256(record[start:]).digest() != record[len(_MAGIC):start]):
        return None
    # The digest matched, so the body is one _pack wrote: its lengths can be trusted.
    fields, pos = [], start
    while pos < len(record):
        (size,) = _LENGTH.unpack_from(record, pos)
        pos += _LENGTH.size
        fields.append(record[pos:pos + size])
        pos += size
    return fields


def kernel_key(kdef, signature: str, arch: str, product: str) -> str:
    """The cache key of ``product`` (what was made from the PTX, with its maker's version,
    e.g. ``"cubin Build cuda_12.9..."``) for one specialization of ``kdef`` on ``arch``."""
    import numba_cuda

    fn = kdef.pyfunc
    # Kernels made by a factory share a __qualname__: their compile-time constants (closure
    # cells holding plain numbers/strings) tell the variants apart.
    constants = [c.cell_contents for c in (fn.__closure__ or ())
                 if isinstance(c.cell_contents, (bool, int, float, str))]
    return "\n".join([_source_digest(fn.__code__.co_filename), fn.__module__, fn.__qualname__,
                      kdef.name, repr(constants), signature, arch, product,
                      repr(sorted(kdef.options.items())),
                      getattr(numba_cuda, "__version__", "?")])


_SOURCE_DIGESTS: dict[str, str] = {}


def _source_digest(path: str) -> str:
    """Hash of every .py file of kaionb plus the kernel's own file (helpers change codegen)."""
    digest = _SOURCE_DIGESTS.get(path)
    if digest is None:
        h = hashlib.sha256()
        package_root = Path(__file__).resolve().parent
        files = sorted(package_root.rglob("*.py"))
        if Path(path).resolve() not in files:
            files.append(Path(path))
        for f in files:
            h.update(str(f.relative_to(f.anchor)).encode())
            h.update(f.read_bytes())
        digest = _SOURCE_DIGESTS[path] = h.hexdigest()
    return digest
