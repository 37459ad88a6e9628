"""Named arrays on disk for ``ortlstm fit``: .npz, .safetensors, folders of .npy, and folders of shards.

Reads files only: what the arrays must be for a model is checked in ``ortlstm.fit``. Shards are
memory-mapped (never read whole), so a dataset may be larger than memory; a batch reads its rows.
Nothing here imports onnxruntime.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SHARD_SUFFIXES = (".npz", ".safetensors")
"""Files of a shard folder that each hold every array of the shard."""

# safetensors' dtype names (its documented header format) -> NumPy's, little-endian on disk
_SAFETENSORS_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, 22 bytes, file name length, extra field length


class ShardedArray:
    """One named array stored in several shard files, read as their concatenation along the batch axis.

    Each part is memory-mapped; ``take`` gathers rows across shard boundaries and reads only
    those rows. ``np.asarray`` of it concatenates every part in memory (avoid it for large data).

    Attributes:
        name: The array's name in every shard.
        parts: The shards' arrays (memory-mapped), in the shards' order.
        files: The shard each part comes from (for messages).
        axis: The axis the parts are concatenated along (the batch axis).
    """

    def __init__(self, name: str, parts: Sequence[np.ndarray], files: Sequence[str], axis: int = 0) -> None:
        self.name = name
        self.parts = tuple(parts)
        self.files = tuple(files)
        self.axis = axis
        self.lengths = tuple(int(part.shape[axis]) if part.ndim > axis else 0 for part in self.parts)
        self._starts = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])

    @property
    def dtype(self) -> np.dtype:
        """The dtype of every part."""
        return self.parts[0].dtype

    @property
    def ndim(self) -> int:
        """The rank of every part."""
        return self.parts[0].ndim

    @property
    def shape(self) -> tuple[int, ...]:
        """The first part's shape with the batch axis summed over the parts."""
        shape = list(self.parts[0].shape)
        if self.axis < len(shape):
            shape[self.axis] = int(self._starts[-1])
        return tuple(shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"ShardedArray({self.name!r}, {self.dtype} {list(self.shape)}, {len(self.parts)} shards, axis {self.axis})"
        )

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        whole = np.concatenate([np.asarray(part) for part in self.parts], axis=self.axis)
        return whole if dtype is None else whole.astype(dtype)

    def along(self, axis: int, where: str) -> ShardedArray:
        """The same parts concatenated along ``axis``; every other axis must agree over the shards.

        Raises:
            ValueError: A shard's part differs from the first one on an axis other than ``axis``;
                the message names the shard file, the array and both shapes.
        """
        expected = self.parts[0].shape
        for file, part in zip(self.files, self.parts, strict=True):
            others = [dim for index, dim in enumerate(part.shape) if index != axis]
            if part.ndim != len(expected) or others != [d for i, d in enumerate(expected) if i != axis]:
                raise ValueError(
                    f"{where}: shard {file}: array {self.name!r} is {part.dtype} {list(part.shape)}, the first shard "
                    f"({self.files[0]}) holds {self.dtype} {list(expected)}; the shards may differ only along the "
                    f"batch axis ({axis})"
                )
        return ShardedArray(self.name, self.parts, self.files, axis)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows ``rows`` (global indices along the batch axis) in that order, read from their shards."""
        rows = np.asarray(rows, dtype=np.int64)
        shard = np.searchsorted(self._starts, rows, side="right") - 1
        local = rows - self._starts[shard]
        shape = list(self.shape)
        shape[self.axis] = len(rows)
        out = np.empty(shape, dtype=self.dtype)
        for part in np.unique(shard):
            positions = np.flatnonzero(shard == part)
            out[_along(self.axis, positions)] = self.parts[part][_along(self.axis, local[positions])]
        return out


class ConcatenatedRows:
    """Variable-length rows stored end to end, ``[sum(lengths)]``: ctc_loss's concatenated labels.

    ``take(rows)`` returns the chosen rows' values end to end, in that order (what
    ``F.ctc_loss`` takes beside their ``target_lengths``).

    Attributes:
        values: The rows end to end (an array or a ``ShardedArray``).
        offsets: Where each row starts, and the end: ``[0, cumsum(lengths)]``.
    """

    def __init__(self, values: Any, lengths: Any) -> None:
        self.values = values
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
        self.dtype = values.dtype

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The values of ``rows``, end to end."""
        starts, ends = self.offsets[rows], self.offsets[np.asarray(rows) + 1]
        pieces = [np.arange(start, end) for start, end in zip(starts, ends, strict=True)]
        positions = np.concatenate(pieces or [np.empty(0, np.int64)])
        return take_rows(self.values, 0, positions.astype(np.int64))


def read_arrays(path: str | Path) -> dict[str, Any]:
    """The named arrays of a data file or folder.

    - ``.npz`` (``np.savez``; compressed archives too) and ``.safetensors``
      (``safetensors.numpy.save_file``): read into memory.
    - A folder of ``NAME.npy`` files (``np.save``): memory-mapped.
    - A folder of shards, in the order of their names (zero-pad the numbers): ``.npz`` files
      written by ``np.savez`` (stored, not compressed), ``.safetensors`` files, or subfolders of
      ``NAME.npy`` files; each holds every array for its samples. They are memory-mapped and read
      as one dataset: ``ShardedArray`` values, the rows of all shards concatenated.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Another file type, a file that does not read as one, a folder of something else,
            or shards that differ in their array names, dtypes or ranks (the message names the shard).
    """
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file {str(path)!r}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        if suffix == ".safetensors":
            from safetensors.numpy import load_file

            return load_file(str(path))
    except Exception as error:
        raise ValueError(f"{path}: cannot read it as {suffix[1:]} ({error})") from error
    raise ValueError(
        f"{path}: expected a .npz (np.savez(path, name=array, ...)) or .safetensors file, got {suffix or 'no suffix'!r}"
    )


def _read_folder(path: Path) -> dict[str, Any]:
    entries = sorted(path.iterdir())
    npy = [entry for entry in entries if entry.is_file() and entry.suffix.lower() == ".npy"]
    shards = [
        entry
        for entry in entries
        if (entry.is_file() and entry.suffix.lower() in SHARD_SUFFIXES) or (entry.is_dir() and any(entry.glob("*.npy")))
    ]
    layouts = (
        f"expected NAME.npy files (np.save('{path}/pixels.npy', array)), or shards: train-00000.npz, "
        "train-00001.npz, ... (np.savez), .safetensors files, or subfolders 00000/, 00001/ ... of NAME.npy files"
    )
    if npy and shards:
        raise ValueError(f"{path}: holds both NAME.npy files and shards {[s.name for s in shards[:3]]}; {layouts}")
    if npy:
        return _map_npy_folder(path)
    if not shards:
        raise ValueError(f"{path}: a folder without data; {layouts}")
    mapped = {shard.name: map_shard(shard) for shard in shards}
    first_file, first = next(iter(mapped.items()))
    for file, arrays in mapped.items():
        if sorted(arrays) != sorted(first):
            raise ValueError(
                f"{path}: shard {file} holds the arrays {sorted(arrays)}, the first shard ({first_file}) "
                f"{sorted(first)}; every shard needs the same arrays"
            )
        for name, array in arrays.items():
            expected = first[name]
            if array.dtype != expected.dtype or array.ndim != expected.ndim:
                raise ValueError(
                    f"{path}: shard {file}: array {name!r} is {array.dtype} {list(array.shape)}, the first shard "
                    f"({first_file}) holds {expected.dtype} {list(expected.shape)}; every shard needs the same "
                    "dtype and trailing shape"
                )
    if len(mapped) == 1:
        return dict(first)
    files = [str(path / file) for file in mapped]
    return {name: ShardedArray(name, [arrays[name] for arrays in mapped.values()], files) for name in first}


def map_shard(path: Path) -> dict[str, np.ndarray]:
    """The arrays of one shard, memory-mapped: a stored .npz, a .safetensors file, or a folder of NAME.npy.

    Raises:
        ValueError: A compressed .npz member (it cannot be memory-mapped), or a file that does not
            read as its type.
    """
    if path.is_dir():
        return _map_npy_folder(path)
    try:
        if path.suffix.lower() == ".npz":
            return _map_npz(path)
        return _map_safetensors(path)
    except (OSError, KeyError, struct.error, json.JSONDecodeError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: cannot read it as a {path.suffix[1:]} shard ({error})") from error


def _map_npy_folder(path: Path) -> dict[str, np.ndarray]:
    return {file.stem: np.load(file, mmap_mode="r", allow_pickle=False) for file in sorted(path.glob("*.npy"))}


def _memmap(path: Path, dtype: np.dtype, offset: int, shape: tuple[int, ...], fortran: bool) -> np.ndarray:
    if int(np.prod(shape)) == 0:  # an empty part: nothing to map
        return np.empty(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _map_npz(path: Path) -> dict[str, np.ndarray]:
    """Each member of an uncompressed .npz mapped at its offset (a member is a whole .npy file)."""
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(
                    f"{path}: array {name!r} is compressed (np.savez_compressed); a shard is memory-mapped, which "
                    "needs its arrays stored: write the shards with np.savez, as .safetensors, or as folders of .npy"
                )
            file.seek(info.header_offset)
            signature, name_length, extra_length = _ZIP_LOCAL_HEADER.unpack(file.read(_ZIP_LOCAL_HEADER.size))
            if signature != b"PK\x03\x04":
                raise ValueError(f"{path}: member {info.filename!r} has no local header")
            file.seek(info.header_offset + _ZIP_LOCAL_HEADER.size + name_length + extra_length)
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
            else:
                raise ValueError(f"{path}: array {name!r} is in .npy format {version}; np.save writes 1.0 or 2.0")
            if dtype.hasobject:
                raise ValueError(f"{path}: array {name!r} holds Python objects ({dtype}); save numbers")
            arrays[name] = _memmap(path, dtype, file.tell(), shape, fortran)
    return arrays


def _map_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Each tensor of a .safetensors file mapped at its offset (an 8-byte header size, a JSON header, data)."""
    with open(path, "rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(size))
    arrays: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(
                f"{path}: tensor {name!r} is {entry['dtype']}, which NumPy cannot map; "
                f"save one of {', '.join(_SAFETENSORS_DTYPES)}"
            )
        begin, _ = entry["data_offsets"]
        arrays[name] = _memmap(path, np.dtype(dtype), 8 + size + begin, tuple(entry["shape"]), False)
    return arrays


def bind_batch_axes(arrays: Mapping[str, Any], axes: Mapping[str, int], where: str) -> dict[str, Any]:
    """The arrays with each ``ShardedArray`` concatenated along its batch axis, checked shard by shard.

    ``axes`` holds the arrays with one entry per sample; the others (ctc_loss's concatenated
    labels) stay concatenated along axis 0 and are not compared.

    Raises:
        ValueError: A shard's array differs from the first shard's off the batch axis, or the arrays
            of one shard hold different numbers of samples (the message names the shard).
    """
    bound = dict(arrays)
    sharded = [name for name, array in arrays.items() if isinstance(array, ShardedArray)]
    for name in sharded:
        array = arrays[name]
        axis = axes.get(name, 0)
        if axis < array.ndim:
            bound[name] = array.along(axis, where)
    counted = [name for name in sharded if name in axes]
    if counted:
        first = bound[counted[0]]
        for name in counted[1:]:
            for file, expected, actual in zip(first.files, first.lengths, bound[name].lengths, strict=True):
                if expected != actual:
                    raise ValueError(
                        f"{where}: shard {file}: array {name!r} holds {actual} samples (axis {bound[name].axis}), "
                        f"{counted[0]!r} {expected} (axis {first.axis}); the arrays of a shard need one entry per "
                        "sample of the shard"
                    )
    return bound


def shard_files(arrays: Mapping[str, Any]) -> list[list[Any]] | None:
    """``[[file name, samples], ...]`` of sharded data (for a resume to check it reads the same), else None."""
    for array in arrays.values():
        if isinstance(array, ShardedArray):
            return [[Path(file).name, length] for file, length in zip(array.files, array.lengths, strict=True)]
    return None


def take_rows(array: Any, axis: int, rows: np.ndarray) -> np.ndarray:
    """``rows`` of ``array`` along ``axis``, contiguous in memory (a ``ShardedArray`` reads them from its shards)."""
    if isinstance(array, ConcatenatedRows):
        return array.take(rows)
    if isinstance(array, ShardedArray):
        if axis != array.axis:
            array = array.along(axis, array.name)
        return array.take(rows)
    return np.ascontiguousarray(array[_along(axis, np.asarray(rows, dtype=np.int64))])


def _along(axis: int, rows: np.ndarray) -> tuple[Any, ...]:
    """The index of ``rows`` along ``axis``.

    Indexing, not ``np.take``: a member of an .npz starts at any byte of the file, and NumPy's
    ``take`` of such an unaligned memory map is a thousand times slower (61 ms vs 0.07 ms for 16
    rows of 64 KiB here).
    """
    return (slice(None),) * axis + (rows,)
