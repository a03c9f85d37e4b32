"""What travels to every rank: the code to run and the variables pushed with it.

Built by the submitting process (cell magic, CLI, Python API, REST) and read by the worker
runtime. One cloudpickle blob, so functions and classes defined in a notebook travel by
value. On Kubernetes the blob is zlib-compressed and split into chunk files.

Inside the blob, the plain fields (kind, source, argv, cwd, sys.path, ...) are read at once,
and the objects (the function, its arguments, pushed variables) each stay pickled until the
rank has the caller's sys.path and working directory (`unpack`): cloudpickle sends what
comes from an importable module (one beside the notebook, say) by reference, and the rank
can import it only then. A failure names the object that could not be loaded.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAYLOAD_VERSION = 2
_PLAIN_FIELDS = ("kind", "source", "filename", "first_line", "argv", "pull", "cwd", "sys_path")
CHUNK_PREFIX = "payload-"


class PayloadError(ValueError):
    """A variable or callable that cannot be sent to the ranks."""


@dataclasses.dataclass
class Payload:
    """`kind` is one of:
    - "code": Python source run as __main__ (a cell). The last expression's value on rank 0
      is the result, unless `pull` names variables to bring back instead.
    - "script": a file run as __main__ with `argv` (the CLI's `mlcluster run train.py`).
    - "module": `python -m module` style, with `argv`.
    - "callable": `function(*args, **kwargs)`; rank 0's return value is the result.
    """

    kind: str = "code"
    source: str = ""
    filename: str = "<cell>"
    # The line number the source starts at where the user sees it: a %%distributed cell's
    # code starts on the notebook cell's line 2 (under the magic), and tracebacks say so.
    first_line: int = 1
    argv: list[str] = dataclasses.field(default_factory=list)
    function: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    push: dict[str, Any] = dataclasses.field(default_factory=dict)
    pull: list[str] = dataclasses.field(default_factory=list)
    cwd: str | None = None
    sys_path: list[str] = dataclasses.field(default_factory=list)
    # The objects as they travelled (a loaded payload's, until `unpack`): one pickle, so
    # that objects shared between them (a model and its optimizer) stay shared.
    packed: bytes | None = dataclasses.field(default=None, repr=False)

    def dumps(self) -> bytes:
        import cloudpickle

        fields = {name: getattr(self, name) for name in _PLAIN_FIELDS}
        try:
            return cloudpickle.dumps(
                {
                    "version": PAYLOAD_VERSION,
                    "fields": fields,
                    "what": self.objects_text(),
                    "objects": self.packed if self.packed is not None else self._pack(),
                }
            )
        except PayloadError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise PayloadError(
                f"cannot send the code to the ranks ({type(exc).__name__}: {exc})"
            ) from None

    def _pack(self) -> bytes:
        import cloudpickle

        for name, value in self.push.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
                raise PayloadError(
                    f"--push {name}: cannot send {type(value).__name__} to the ranks "
                    f"({type(exc).__name__}: {exc})"
                ) from None
        objects = (self.function, self.args, self.kwargs, self.push)
        try:
            return cloudpickle.dumps(objects)
        except Exception as exc:  # noqa: BLE001
            raise PayloadError(
                f"cannot send {self.objects_text()} to the ranks ({type(exc).__name__}: {exc})"
            ) from None

    def objects_text(self) -> str:
        """What the objects are, in words (for an error about them)."""
        if self.packed is not None:
            return self._what
        parts = []
        if self.function is not None:
            parts.append(f"the function {_describe(self.function)}")
        if self.args or self.kwargs:
            types = [type(v).__name__ for v in (*self.args, *self.kwargs.values())]
            parts.append(f"its arguments ({', '.join(types)})")
        if self.push:
            parts.append(f"the pushed variables ({', '.join(self.push)})")
        return " and ".join(parts) or "the code"

    @staticmethod
    def loads(data: bytes) -> Payload:
        """The payload's plain fields; its objects stay packed until `unpack`."""
        import cloudpickle

        obj = cloudpickle.loads(data)  # plain data only: imports nothing of the caller's
        if isinstance(obj, dict) and obj.get("version") == 1 and "payload" in obj:
            return obj["payload"]  # stored before version 2 (a schedule's): all loaded at once
        if not isinstance(obj, dict) or obj.get("version") != PAYLOAD_VERSION:
            raise PayloadError(
                "payload was written by an incompatible version of jupyterlab-mlcluster"
            )
        payload = Payload(**obj["fields"])
        payload.packed = obj["objects"]
        payload._what = str(obj.get("what") or "the code")
        return payload

    def unpack(self) -> None:
        """Load the function, its arguments and the pushed variables: in the rank, once its
        sys.path and working directory are the caller's. PayloadError says what failed."""
        import cloudpickle

        if self.packed is None:
            return
        try:
            self.function, self.args, self.kwargs, self.push = cloudpickle.loads(self.packed)
        except Exception as exc:  # noqa: BLE001 - whatever unpickling raised, say what
            raise PayloadError(_load_failure(self._what, exc)) from None
        self.packed = None

    _what = "the code"


def _describe(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None) or type(function).__name__
    return f"{module}.{qualname}" if module and module != "__main__" else qualname


def _load_failure(what: str, exc: Exception) -> str:
    import sys

    text = f"cannot load {what} on this rank: {type(exc).__name__}: {exc}"
    if isinstance(exc, ImportError):
        # What travels by reference must be importable where the rank runs.
        text += (
            f" (the rank's working directory: {os.getcwd()}; its sys.path: {sys.path}; a"
            " module the caller imported must be importable on the ranks too: beside the"
            " notebook or installed)"
        )
    return text


def read_payload_bytes(path: str | os.PathLike[str]) -> bytes:
    """A payload file, or a directory of zlib-compressed chunks (Kubernetes)."""
    p = Path(path)
    if p.is_dir():
        chunks = sorted(c for c in p.iterdir() if c.name.startswith(CHUNK_PREFIX))
        if not chunks:
            raise PayloadError(f"no payload chunks in {p}")
        return zlib.decompress(b"".join(c.read_bytes() for c in chunks))
    return p.read_bytes()
