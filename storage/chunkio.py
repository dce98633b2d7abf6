"""Whole-chunk reads and writes of uncompressed snapshot arrays, straight to and from the chunk files.

Why this exists rather than ``array[start:stop] = data`` and reads by slice through zarr-python: with
zarr-python 3.1 the public path runs its CRC32C and copies on Zarr's one event-loop thread, allocates a
fresh buffer per chunk and writes each chunk through a temporary file and a rename, which kept snapshots
and restores below ``benchmarks/snapshot.py``'s targets against raw ``tofile``/``fromfile`` of the same
bytes (the comparison is in ``docs/scaling.md``). So these few functions keep
the files exactly as Zarr lays them out for the ``bytes`` (+ ``crc32c``) codec chain: chunk ``i`` of an
array is the file ``c/i/0...``, holding the chunk's C-order little-endian bytes (the last chunk padded
with the fill value 0 to the full chunk shape), then, with checksums, the CRC32C of those bytes as 4
little-endian bytes. Every array written here is a regular Zarr v3 array that ``zarr.open`` reads (the
test suite checks it bit for bit). Arrays with any other codec chain (``zstd``) go through Zarr's public
API. Only public zarr-python names are used (``zarr.Array``, ``zarr.buffer.cpu.NDBuffer``).
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
from typing import Any

import numpy as np
import zarr
from zarr.buffer.cpu import NDBuffer

from carls_dask.errors import CorruptStoreError

__all__ = ["READ_CODECS", "check_chunks", "open_checked", "plain_codecs", "read_rows", "scratch", "write_chunks"]

#: Codecs a snapshot array may name; an array with any other (e.g. a pickling codec) is refused unread.
READ_CODECS = frozenset({"bytes", "crc32c", "zstd"})
#: Codec chain of uncompressed snapshot arrays, which :func:`write_chunks` encodes itself.
_PLAIN_CODECS = ([{"name": "bytes", "configuration": {"endian": "little"}}],
                 [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                 [{"name": "bytes"}], [{"name": "bytes"}, {"name": "crc32c"}])


def plain_codecs(z: zarr.Array) -> bool | None:
    """For an uncompressed array: whether chunks carry a CRC32C; None when other codecs are involved."""
    meta: dict[str, Any] = json.loads(json.dumps(z.metadata.to_dict(), default=str))  # tuples -> lists
    codecs = meta.get("codecs")
    separator = meta.get("chunk_key_encoding", {}).get("configuration", {}).get("separator", "/")
    if codecs not in _PLAIN_CODECS or separator != "/" or z.dtype.byteorder == ">":
        return None
    return bool(codecs[-1]["name"] == "crc32c")


_ZEROS = np.zeros(1 << 20, dtype=np.uint8)
_SCRATCH = threading.local()


def scratch(nbytes: int, slot: str = "rows") -> np.ndarray:
    """A per-thread byte buffer reused across chunks (fresh memory costs page faults on every first touch)."""
    buf = getattr(_SCRATCH, slot, None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1), dtype=np.uint8)
        setattr(_SCRATCH, slot, buf)
    return buf[:nbytes]


def _read_into(fh: Any, data: np.ndarray) -> int:
    view = memoryview(data.data)
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _write_all(fh: Any, data: np.ndarray) -> None:
    view = memoryview(data.data)
    while view:
        view = view[fh.write(view) :]


def write_chunks(z: zarr.Array, folder: pathlib.Path, a: Any, order: np.ndarray | None) -> bool:
    """Write the chunks of an uncompressed array directly as files; False if its codecs need Zarr.

    The files are exactly what Zarr writes for the ``bytes`` (+ ``crc32c``) codec chain: each chunk's
    C-order little-endian bytes (the last chunk padded with the fill value 0 to the full chunk shape),
    then, with checksums, the CRC32C of those bytes as 4 little-endian bytes. Rows are gathered into bucket
    order one chunk at a time, so no sorted copy of the whole array is made.
    """
    crc = plain_codecs(z)
    if crc is None:
        return False
    if crc:
        import google_crc32c  # zarr's own dependency for its crc32c codec

    if isinstance(a, np.ndarray) and a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    c = int(z.chunks[0])
    n = int(a.shape[0])
    trailing = "/".join("0" for _ in a.shape[1:])
    row_bytes = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    for i, start in enumerate(range(0, n, c)):
        stop = min(n, start + c)
        if order is not None:
            block = scratch((stop - start) * row_bytes).view(a.dtype).reshape(stop - start, *a.shape[1:])
            if isinstance(a, np.ndarray) and a.flags.c_contiguous:
                np.take(a, order[start:stop], axis=0, out=block)
            else:  # a strided view (np.take would copy the whole array first), or a row store (RowView)
                block[...] = a[order[start:stop]]
        else:
            block = np.ascontiguousarray(a[start:stop])
        data = block.reshape(-1).view(np.uint8)
        pad = (c - (stop - start)) * row_bytes  # the last chunk is stored at full size, padded with zeros
        key = f"c/{i}" + (f"/{trailing}" if trailing else "")
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        with open(folder / key, "wb", buffering=0) as fh:
            _write_all(fh, data)
            value = google_crc32c.value(data) if crc else 0
            while pad:
                piece = min(pad, len(_ZEROS))
                _write_all(fh, _ZEROS[:piece])
                if crc:
                    value = google_crc32c.extend(value, _ZEROS[:piece])
                pad -= piece
            if crc:
                fh.write(int(value).to_bytes(4, "little"))
    return True


def read_rows(
    z: zarr.Array, folder: pathlib.Path, start: int, stop: int, dest: np.ndarray, *, plain: Any = ...
) -> None:
    """Read rows ``start:stop`` (``start`` chunk-aligned) into ``dest``, straight from the chunk files.

    The inverse of :func:`write_chunks` for uncompressed arrays (CRC32C verified when present); other
    codec chains go through Zarr. ``plain`` is :func:`plain_codecs` of ``z`` when the caller has it.
    """
    crc = plain_codecs(z) if plain is ... else plain
    if crc is None or dest.dtype != z.dtype or not dest.flags.c_contiguous:
        z.get_basic_selection(slice(start, stop), out=NDBuffer.from_numpy_array(dest))
        return
    if crc:
        import google_crc32c  # zarr's own dependency for its crc32c codec
    c = int(z.chunks[0])
    row_bytes = dest.itemsize * int(np.prod(z.shape[1:], dtype=np.int64))
    trailing = "/".join("0" for _ in z.shape[1:])
    flat = dest.reshape(-1).view(np.uint8)
    for i in range(start // c, -(-stop // c)):
        lo = i * c
        hi = min(stop, lo + c)
        key = f"c/{i}" + (f"/{trailing}" if trailing else "")
        part = flat[(lo - start) * row_bytes : (hi - start) * row_bytes]
        pad = (c - (hi - lo)) * row_bytes
        with open(folder / key, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            expected = c * row_bytes + (4 if crc else 0)
            if size != expected:
                raise CorruptStoreError(f"chunk {key} of {folder} has {size} bytes; expected {expected}")
            got = _read_into(fh, part)
            value = google_crc32c.value(part) if crc else 0
            while pad and crc:  # the padding of the last chunk only matters to the checksum
                piece = _read_into(fh, scratch(min(pad, 1 << 20), "pad"))
                if not piece:
                    break
                value = google_crc32c.extend(value, scratch(piece, "pad"))
                pad -= piece
            if crc:
                fh.seek(size - 4)
                stored = fh.read(4)
        if got != part.nbytes:
            raise CorruptStoreError(f"chunk {key} of {folder}: short read ({got} of {part.nbytes} bytes)")
        if crc and int(value).to_bytes(4, "little") != stored:
            raise CorruptStoreError(f"chunk {key} of {folder}: checksum mismatch; the chunk is damaged")


def open_checked(group: zarr.Group, name: str) -> zarr.Array:
    """Open one array of a shard store; refuse anything but numeric data under this writer's codecs."""
    try:
        node = group[name]
    except Exception as exc:  # zarr raises assorted errors on damaged or foreign metadata
        raise CorruptStoreError(f"{group.store}: {name} cannot be opened ({type(exc).__name__}: {exc}); "
                                "expected an array written by write_shard") from exc
    if not isinstance(node, zarr.Array):
        raise CorruptStoreError(f"{group.store}: {name} is a group; expected an array")
    meta: dict[str, Any] = dict(node.metadata.to_dict())
    codecs = [c.get("name") if isinstance(c, dict) else getattr(c, "codec_name", c) for c in meta.get("codecs") or []]
    if np.dtype(node.dtype).kind not in "biuf" or not set(codecs) <= READ_CODECS:
        raise CorruptStoreError(f"{group.store}: {name} is {node.dtype} with codecs {codecs}; expected a numeric "
                                f"array with codecs from {sorted(READ_CODECS)} (nothing else is decoded)")
    if meta.get("attributes"):
        raise CorruptStoreError(f"{group.store}: {name} carries attributes {sorted(dict(meta['attributes']))}; expected "
                                "none (write_shard writes none)")
    return node


def check_chunks(arr: zarr.Array, path: pathlib.Path, what: str) -> None:
    """Zarr reads a missing chunk as fill values; a snapshot never has one, so a missing file is corruption."""
    if arr.shape[0] == 0:
        return
    n_chunks = -(-arr.shape[0] // arr.chunks[0])
    trailing = "/".join("0" for _ in arr.shape[1:])
    for i in range(n_chunks):
        key = f"c/{i}" + (f"/{trailing}" if trailing else "")
        if not (path / key).is_file():
            raise CorruptStoreError(f"{what}: chunk {key} of {path} is missing; expected {n_chunks} chunks")
