"""What a warm rank sheds so that it starts as a fresh interpreter would: the state that the
zygote's entry and the supervisor set up in the process the rank is forked from.

The zygote remembers (remember(), once its preload is done) how the preloaded modules left
logging, and which of our modules a fresh `python -m jupyterlab_mlcluster.runtime.worker`
imports. A rank then (become_rank):

- logging: every logger as the preload left it. The supervisor's handler on the root logger
  (logging.basicConfig, a RotatingFileHandler on supervisor.log) is closed before the rank
  closes the descriptors it inherited: left there, its descriptor number went to the user's
  next open file, which received the records of every library warning (issue 30), the
  user's own basicConfig did nothing, and a warning with no file open printed a "Logging
  error" traceback. Our own loggers are dropped: a cold rank has none;
- signals: every disposition, the wakeup fd and the signal mask as Python sets them at start;
- modules: ours that a cold rank does not import (the supervisor's, the zygote's, the
  backends') leave sys.modules and their packages.
"""

from __future__ import annotations

import ast
import logging
import signal
import sys
from pathlib import Path
from typing import Any

_OURS = "jupyterlab_mlcluster"
_ENTRY = "jupyterlab_mlcluster.runtime.worker"  # what a cold rank runs (as __main__)
# (logger, handlers, level, propagate, disabled, filters) of every logger after the preload.
_LOGGING: list[tuple[logging.Logger, list[Any], int, bool, bool, list[Any]]] | None = None
_LOGGING_DISABLE = 0
_RANK_MODULES: frozenset[str] | None = None
# Dropped handlers whose stream this process must not close (stdio, the report channel):
# kept referenced so that no finalizer closes it later (a rank ends with os._exit).
_KEPT: list[logging.Handler] = []


def remember() -> None:
    """In the zygote, after its preload: what a rank goes back to."""
    global _LOGGING, _LOGGING_DISABLE, _RANK_MODULES
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    _LOGGING = [
        (lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled, list(lg.filters))
        for lg in loggers
        if not lg.name.startswith(_OURS)
    ]
    _LOGGING_DISABLE = logging.Logger.manager.disable
    _RANK_MODULES = imported_by(_ENTRY)


def shed_logging(keep_fds: tuple[int, ...]) -> None:
    """Loggers back to the preload's state; handlers added since are closed (a file handler's
    file: while its descriptor is still the one it opened) or, where they write to a
    descriptor in `keep_fds` or to stdio, only dropped. Before the rank closes descriptors."""
    if _LOGGING is None:
        return
    dropped: list[Any] = []
    for lg, handlers, level, propagate, disabled, filters in _LOGGING:
        if lg.handlers != handlers:
            dropped += [h for h in lg.handlers if h not in handlers]
            lg.handlers = list(handlers)
        if (lg.level, lg.propagate, lg.disabled, lg.filters) != (
            level,
            propagate,
            disabled,
            filters,
        ):
            lg.level, lg.propagate, lg.disabled = level, propagate, disabled
            lg.filters = list(filters)
    manager = logging.Logger.manager
    for name in [n for n in manager.loggerDict if n.startswith(_OURS)]:
        ours = manager.loggerDict.pop(name)
        if isinstance(ours, logging.Logger):
            dropped += ours.handlers
    manager.disable = _LOGGING_DISABLE
    manager._clear_cache()  # type: ignore[attr-defined]  # levels changed
    for handler in dropped:
        _close(handler, keep_fds)
    gone = {id(h) for h in dropped}
    with logging._lock:  # type: ignore[attr-defined]  # logging.shutdown's list, at exit
        logging._handlerList[:] = [  # type: ignore[attr-defined]
            ref
            for ref in logging._handlerList  # type: ignore[attr-defined]
            if id(ref()) not in gone
        ]


def _close(handler: logging.Handler, keep_fds: tuple[int, ...]) -> None:
    stream = getattr(handler, "stream", None)
    try:
        fd = stream.fileno() if stream is not None else None
    except (OSError, ValueError, AttributeError):
        fd = None
    if (
        isinstance(handler, logging.FileHandler)
        and fd is not None
        and fd > 2
        and fd not in keep_fds
    ):
        try:
            handler.close()  # its own file: this process's copy of the descriptor closes
            return
        except (OSError, ValueError):
            pass
    _KEPT.append(handler)


def reset_signals() -> None:
    """Every signal as a fresh Python has it: SIGINT raises KeyboardInterrupt, SIGPIPE and
    SIGXFSZ are ignored, all others take their default action; no wakeup fd, none blocked."""
    fresh: dict[int, Any] = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGPIPE: signal.SIG_IGN,
        signal.SIGXFSZ: signal.SIG_IGN,
    }
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, fresh.get(signum, signal.SIG_DFL))
        except (OSError, ValueError):  # (reserved by the C library: never ours to change)
            pass
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def shed_modules() -> None:
    """Our modules that a cold rank does not have leave sys.modules (and the package that
    holds them): a later import finds them afresh, as in a fresh interpreter. Code already
    running keeps its references. The entry module goes too: a cold rank runs it as
    __main__, never under its name."""
    if _RANK_MODULES is None:
        return
    keep = _RANK_MODULES - {_ENTRY}
    ours = [n for n in sys.modules if n.startswith(_OURS)]
    for name in [n for n in ours if n.partition(".")[0] == _OURS and n not in keep]:
        module = sys.modules.pop(name)
        parent, _, child = name.rpartition(".")
        holder = sys.modules.get(parent)
        if holder is not None and getattr(holder, child, None) is module:
            delattr(holder, child)


def imported_by(entry: str) -> frozenset[str]:
    """Our modules that importing `entry` in a fresh interpreter imports (itself and its
    packages among them), found by reading the top-level imports of their sources (each
    must already be imported here: the zygote has them all)."""
    found: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in found or name.partition(".")[0] != _OURS or name not in sys.modules:
            continue
        found.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)  # importing a module runs its packages' __init__ first
        todo += _imports_of(name)
    return frozenset(found)


def _imports_of(name: str) -> list[str]:
    """The modules `name`'s source imports at its top level (not under TYPE_CHECKING)."""
    module = sys.modules[name]
    path = getattr(module, "__file__", None)
    if not path:
        return []
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    package = name if hasattr(module, "__path__") else name.rpartition(".")[0]
    names: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                names.append(base)
                # `from package import module` imports the module
                names.extend(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and not _type_checking(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody):
                    visit(block)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return [n for n in names if n in sys.modules]


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
