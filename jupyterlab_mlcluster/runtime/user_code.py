"""Running the user's code as a fresh interpreter would: `__main__` and `sys.argv`, the
`sys.path` `python script.py` / `python -m mod` / a cell would have, a cell's last bare
expression as its value, and the interpreter's own shutdown (threads, atexit handlers, open
files). Used by a job's rank (runtime/worker.py) and a session's (runtime/session_worker.py).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import gc
import io
import linecache
import os
import runpy
import sys
import types
from typing import Any

from .outcome import ResultError
from .payload import Payload


def run_payload(payload: Payload, rank: int) -> tuple[str, Any]:
    """Run the user's code as __main__. Returns ("value", v), ("pull", {..}) or ("none", None)."""
    if payload.cwd:
        try:
            os.chdir(payload.cwd)
        except OSError:
            pass  # a pod has no such directory; its image's workdir will do
    sys.path[:] = fresh_sys_path(payload)
    # What `python script.py` / `python -m mod` would show; a cell gets `python -c`'s.
    sys.argv = (
        [payload.filename, *payload.argv] if payload.kind != "code" or payload.argv else ["-c"]
    )
    payload.unpack()  # the caller's objects: their modules import from the path just set

    if payload.kind == "callable":
        value = payload.function(*payload.args, **payload.kwargs)  # type: ignore[misc]
        return ("value", value) if value is not None else ("none", None)

    main = types.ModuleType("__main__")
    main.__dict__.update(payload.push)
    main.__dict__["__builtins__"] = __builtins__
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickling classes defined in the cell needs this
    try:
        if payload.kind == "script":
            main.__dict__.update(
                runpy.run_path(payload.filename, init_globals=main.__dict__, run_name="__main__")
            )
            value = None
        elif payload.kind == "module":
            main.__dict__.update(
                runpy.run_module(payload.filename, run_name="__main__", alter_sys=True)
            )
            value = None
        else:
            value = _exec_cell(payload.source, payload.filename, main.__dict__, payload.first_line)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
    if payload.pull:
        missing = [name for name in payload.pull if name not in main.__dict__]
        if missing:
            raise ResultError(
                f"--pull {', '.join(missing)}: not defined on rank {rank} after the cell ran"
            )
        return "pull", {name: main.__dict__[name] for name in payload.pull}
    return ("value", value) if value is not None else ("none", None)


def fresh_sys_path(payload: Payload) -> list[str]:
    """sys.path as a fresh interpreter running this payload would have it.

    This process was started as `python -m ...` (cold) or forked from one (warm: the pool's),
    which put its own start directory first; a fresh `python script.py` puts the script's
    directory there instead, `python -m mod` the working directory, and a cell gets the
    kernel's path (with its '' entry: modules next to the notebook import)."""
    base = list(sys.path) if sys.flags.safe_path else sys.path[1:]
    if payload.kind == "script":
        first = [] if sys.flags.safe_path else [os.path.dirname(os.path.abspath(payload.filename))]
    elif payload.kind == "module":
        first = [] if sys.flags.safe_path else [os.getcwd()]
    else:
        first = list(payload.sys_path) or [""]
    path = list(first)
    for entry in base:
        if entry not in path:
            path.append(entry)
    return path


def _exec_cell(source: str, filename: str, namespace: dict[str, Any], first_line: int = 1) -> Any:
    """exec the cell; like IPython, a final bare expression is evaluated and returned.
    Its lines count from `first_line` (blank lines before it keep every number, in
    tracebacks and syntax errors alike, what the notebook shows)."""
    source = "\n" * max(0, first_line - 1) + source
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    tree = ast.parse(source, filename=filename, mode="exec")
    last = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def _shutdown_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def shut_down_like_an_interpreter() -> None:
    """What Python does after a script's last line (Py_FinalizeEx), in its order, so that a
    warm rank (which leaves with os._exit: it shares the pool's inherited state) loses nothing
    a fresh `python script.py` would keep: wait for non-daemon threads, run atexit handlers
    (also multiprocessing's, which stops daemonic children such as DataLoader workers), then
    flush every file the user left open."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()  # joins non-daemon threads
    atexit._run_exitfuncs()  # prints and skips a failing handler, as at interpreter exit
    _shutdown_process_group()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _flush_open_files() -> None:
    """Flush buffered files nobody closed (a fresh interpreter's finalizers would).

    Needed in cold ranks too: a script's globals live on in runpy's namespace, which
    interpreter finalization does not clear the way it clears `__main__` (without this, the
    data of a file left open is lost). A warm rank's inherited objects are frozen (gc.freeze) and
    so not listed: only what the rank made is visited. Text layers first: they write into
    their binary buffers."""
    text, binary = [], []
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: a dead weakref proxy raises on __class__
        if issubclass(kind, io.TextIOWrapper):
            text.append(obj)
        elif issubclass(kind, (io.BufferedWriter, io.BufferedRandom)):
            binary.append(obj)
    for stream in text + binary:
        with contextlib.suppress(Exception):
            if not stream.closed:
                stream.flush()
