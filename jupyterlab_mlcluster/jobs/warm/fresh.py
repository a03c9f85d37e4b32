"""What a warm rank sheds so that it starts as a fresh interpreter would: the state that the
zygote's entry and the supervisor set up in the process the rank is forked from.

The zygote remembers (remember(), once its preload is done) how the preloaded modules left
logging, and which of our modules a fresh `python -m jupyterlab_mlcluster.runtime.worker`
imports. A rank then (become_rank):

- logging: every logger as the preload left it. The supervisor's handler on the root logger
  (logging.basicConfig, a RotatingFileHandler on supervisor.log) is closed before the rank
  closes the descriptors it inherited: left there, its descriptor number goes to the user's
  next open file, which then receives the records of every library warning; the user's own
  basicConfig would do nothing, and a warning with no file open would print a "Logging
  error" traceback. Our own loggers are dropped: a cold rank has none;
- signals: every disposition, the wakeup fd and the signal mask as Python sets them at start;
- modules: ours that a cold rank does not import (the supervisor's, the zygote's, the
  backends') leave sys.modules and their packages.
"""

from __future__ import annotations

import ast
import itertools
import logging
import signal
import sys
from pathlib import Path
from typing import Any

_OURS = "jupyterlab_mlcluster"
_ENTRY = "jupyterlab_mlcluster.runtime.worker"  # what a cold rank runs (as __main__)
# Taken by remember() in the zygote. A rank touches as little as it can of what it inherited:
# each object it reads is written (its reference count), so every page holding one is
# copied; a walk over every logger and module cost a rank 8 ms (2 cores, under load 40).
_ROOT: tuple[list[Any], int, bool, bool, list[Any]] | None = None
_LOGGING_DISABLE = 0
_OUR_LOGGERS: list[str] = []
_LOGGERS_SEEN = 0  # how many loggers there were: the supervisor's are the ones after
_DROP: list[str] = []  # our modules a cold rank does not import
_KEEP: frozenset[str] = frozenset()  # and those it does
_MODULES_SEEN = 0
_SIGNALS: list[tuple[int, Any]] = []  # (signal, its disposition in a fresh rank)
# Dropped handlers whose stream this process must not close (stdio, the report channel):
# kept referenced so that no finalizer closes it later (a rank ends with os._exit).
_KEPT: list[logging.Handler] = []


def remember() -> None:
    """In the zygote, after its preload: what a rank goes back to."""
    global _ROOT, _LOGGING_DISABLE, _OUR_LOGGERS, _LOGGERS_SEEN, _DROP, _KEEP, _MODULES_SEEN
    root, manager = logging.getLogger(), logging.Logger.manager
    _ROOT = (list(root.handlers), root.level, root.propagate, root.disabled, list(root.filters))
    _LOGGING_DISABLE = manager.disable
    _OUR_LOGGERS = [name for name in manager.loggerDict if name.startswith(_OURS)]
    _LOGGERS_SEEN = len(manager.loggerDict)
    _KEEP = imported_by(_ENTRY) - {_ENTRY}
    _DROP = [name for name in sys.modules if _is_ours(name) and name not in _KEEP]
    _MODULES_SEEN = len(sys.modules)
    # Python's own at start for SIGINT, SIGPIPE, SIGXFSZ; the zygote's handlers (SIGTERM)
    # go back to the default; what the preloads set (or inherited as ignored) stays.
    python_sets = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGPIPE: signal.SIG_IGN,
        signal.SIGXFSZ: signal.SIG_IGN,
    }
    _SIGNALS.clear()
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        now: Any = signal.getsignal(signum)
        if signum in python_sets:
            now = python_sets[signum]
        elif callable(now) and getattr(now, "__module__", "").startswith(_OURS):
            now = signal.SIG_DFL
        _SIGNALS.append((int(signum), now))


def shed_logging(keep_fds: tuple[int, ...]) -> None:
    """The root logger back to the preload's state, our loggers gone; handlers dropped are
    closed (a file handler's file: while its descriptor is still the one it opened) or,
    where they write to a descriptor in `keep_fds` or to stdio, only dropped. Before the
    rank closes descriptors. (Our code configures no other logger.)"""
    if _ROOT is None:
        return
    root, manager = logging.getLogger(), logging.Logger.manager
    handlers, level, propagate, disabled, filters = _ROOT
    dropped: list[Any] = [h for h in root.handlers if h not in handlers]
    if (root.level, manager.disable) != (level, _LOGGING_DISABLE):
        # Every logger's cached answers may have changed (a walk over all of them: only then).
        root.level, manager.disable = level, _LOGGING_DISABLE
        manager._clear_cache()  # type: ignore[attr-defined]
    root.handlers, root.filters = list(handlers), list(filters)
    root.propagate, root.disabled = propagate, disabled
    for name in _OUR_LOGGERS + _ours_since(manager.loggerDict, _LOGGERS_SEEN):
        ours = manager.loggerDict.pop(name, None)
        if isinstance(ours, logging.Logger):
            dropped += ours.handlers
    if not dropped:
        return
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
    """Every signal as in a fresh rank: as Python sets SIGINT, SIGPIPE and SIGXFSZ at start,
    the supervisor's and the zygote's handlers back to the default, no wakeup fd, no signal
    blocked."""
    for signum, disposition in _SIGNALS:
        if disposition is not None and signal.getsignal(signum) is not disposition:
            try:
                signal.signal(signum, disposition)
            except (OSError, ValueError):  # (reserved by the C library: never ours to change)
                pass
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def shed_modules() -> None:
    """Our modules that a cold rank does not have leave sys.modules (and the package that
    holds them): a later import finds them afresh, as in a fresh interpreter. Code already
    running keeps its references. The entry module goes too: a cold rank runs it as
    __main__, never under its name."""
    since = [n for n in _ours_since(sys.modules, _MODULES_SEEN) if n not in _KEEP]
    for name in _DROP + since:
        module = sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        holder = sys.modules.get(parent)
        if module is not None and holder is not None and getattr(holder, child, None) is module:
            delattr(holder, child)


def _is_ours(name: str) -> bool:
    return name.partition(".")[0] == _OURS


def _ours_since(names: dict[str, Any], seen: int) -> list[str]:
    """Our names among those added to `names` (insertion-ordered) after it held `seen`."""
    added = len(names) - seen
    recent = itertools.islice(reversed(names), added) if added >= 0 else iter(names)
    return [name for name in recent if _is_ours(name)]


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
