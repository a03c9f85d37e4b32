"""What travels to every rank: the code to run and the variables pushed with it.

Built by the submitting process (cell magic, CLI, Python API, REST) and read by the worker
runtime. One cloudpickle blob, so functions and classes defined in a notebook travel by
value. On Kubernetes the blob is zlib-compressed and split into chunk files.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAYLOAD_VERSION = 1
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
    argv: list[str] = dataclasses.field(default_factory=list)
    function: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    push: dict[str, Any] = dataclasses.field(default_factory=dict)
    pull: list[str] = dataclasses.field(default_factory=list)
    cwd: str | None = None
    sys_path: list[str] = dataclasses.field(default_factory=list)

    def dumps(self) -> bytes:
        import cloudpickle

        for name, value in self.push.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
                raise PayloadError(
                    f"--push {name}: cannot send {type(value).__name__} to the ranks "
                    f"({type(exc).__name__}: {exc})"
                ) from None
        try:
            return cloudpickle.dumps({"version": PAYLOAD_VERSION, "payload": self})
        except Exception as exc:  # noqa: BLE001
            raise PayloadError(
                f"cannot send the code to the ranks ({type(exc).__name__}: {exc})"
            ) from None

    @staticmethod
    def loads(data: bytes) -> Payload:
        import cloudpickle

        obj = cloudpickle.loads(data)
        if not isinstance(obj, dict) or obj.get("version") != PAYLOAD_VERSION:
            raise PayloadError(
                "payload was written by an incompatible version of jupyterlab-mlcluster"
            )
        return obj["payload"]


def read_payload_bytes(path: str | os.PathLike[str]) -> bytes:
    """A payload file, or a directory of zlib-compressed chunks (Kubernetes)."""
    p = Path(path)
    if p.is_dir():
        chunks = sorted(c for c in p.iterdir() if c.name.startswith(CHUNK_PREFIX))
        if not chunks:
            raise PayloadError(f"no payload chunks in {p}")
        return zlib.decompress(b"".join(c.read_bytes() for c in chunks))
    return p.read_bytes()
