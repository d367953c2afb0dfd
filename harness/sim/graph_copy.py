"""Copying an object graph through pickle, with some objects travelling by reference (SimBackend.fork).

Kept out of the compiled modules (harness/native.py): pickle's C Pickler calls `persistent_id` and
`persistent_load` as Python methods of a Python subclass.
"""
from __future__ import annotations

import io
import pickle


class _Pickler(pickle.Pickler):
    """Pickles the graph; the objects in `replace` travel by reference (persistent ids)."""

    def __init__(self, buf, replace: dict[int, object]):
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.replace = replace

    def persistent_id(self, obj):
        return id(obj) if id(obj) in self.replace else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, buf, replace: dict[int, object]):
        super().__init__(buf)
        self.replace = replace

    def persistent_load(self, pid):
        return self.replace[pid]


def pickled(root, replace: dict[int, object]) -> bytes:
    """`root`'s graph as bytes; an object whose id is a key of `replace` is stored by reference."""
    buf = io.BytesIO()
    _Pickler(buf, replace).dump(root)
    return buf.getvalue()


def unpickled(data: bytes, replace: dict[int, object]):
    """The graph back, each reference replaced by `replace`'s value for it."""
    return _Unpickler(io.BytesIO(data), replace).load()
