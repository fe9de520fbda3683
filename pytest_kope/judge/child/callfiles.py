"""The differential check's arrays on disk: raw streams of bytes with an index, not zip archives.

The recorded inputs are one stream and a replay's outputs another, each entry named in an index of
names and sizes. A reader maps the stream once and views each entry as the shape and type it
already knows (from the manifest, or from the committed kernel's outputs), so what a child wrote
is never trusted to say what it holds. Archives cost half a replay: a zip directory parsed per
call, a CRC over every byte written and read again, a file opened per call.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

Layout = tuple[tuple[int, ...], np.dtype[Any]]  # shape, type


class Stream:
    """Arrays appended as raw bytes to `<name>.bin` in `folder`, named in `<name>.json`."""

    def __init__(self, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.index_path = folder / f"{name}.json"
        self.stream = (folder / f"{name}.bin").open("wb")
        self.index: list[tuple[str, int]] = []

    def write(self, name: str, array: Any) -> None:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self.stream.write(data.data)
        self.index.append((name, int(data.size)))

    def close(self) -> None:
        self.stream.close()
        self.index_path.write_text(json.dumps(self.index))


def layout(array: Any) -> Layout:
    """The shape and type an entry is read back as."""
    return tuple(array.shape), np.dtype(array.dtype)


def read(folder: Path, name: str, layouts: Mapping[str, Layout]) -> dict[str, np.ndarray]:
    """The arrays of stream `name`, each a read-only view with the layout `layouts` gives its name.

    ValueError when the index is not a list of known names with the sizes of their layouts, or
    does not add up to the stream's length: the stream may be a candidate's. No stream: nothing.
    """
    index_path, stream_path = folder / f"{name}.json", folder / f"{name}.bin"
    try:
        index = json.loads(index_path.read_text()) if index_path.exists() else []
    except RecursionError:  # nested deeper than the parser goes: not an index
        raise ValueError(f"{index_path.name} is not a list of names and sizes") from None
    data = _mapped(stream_path)
    out, offset = {}, 0
    for item in index if isinstance(index, list) else [index]:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in layouts and type(item[1]) is int):
            raise ValueError(f"unknown entry {str(item)[:80]} in {index_path.name}")
        key, size = item
        shape, dtype = layouts[key]
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size != want:
            raise ValueError(f"{key}: {size} bytes, not the {want} of a {dtype} {shape}")
        if offset + size > len(data):
            raise ValueError(f"{key}: {stream_path.name} ends after {len(data)} bytes")
        view = np.frombuffer(data, dtype, size // dtype.itemsize, offset) if size else np.empty(0, dtype)
        out[key] = view.reshape(shape)
        offset += size
    if offset != len(data):
        raise ValueError(
            f"{len(data) - offset} bytes of {stream_path.name} past what {index_path.name} names"
        )
    return out


def _mapped(path: Path) -> Any:
    """The file's bytes, mapped read-only (nothing to map: empty bytes)."""
    if not path.exists() or path.stat().st_size == 0:
        return b""
    with path.open("rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
