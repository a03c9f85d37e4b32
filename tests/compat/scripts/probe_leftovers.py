"""A probe run unchanged under torchrun and `mlcluster run` (warm and cold ranks): it records
the process state a launcher could leave behind in a rank (logging, signals, descriptors,
threads, the environment, modules, exit handlers) before the script has done anything.

Usage: probe_leftovers.py OUTDIR TAG; writes OUTDIR/TAG-RANK.json.
"""

import atexit
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import warnings
import weakref

import torch  # a training script's first import: every launcher's rank has it

out, tag = sys.argv[1], sys.argv[2]


def handler_name(handler):
    return getattr(handler, "__qualname__", None) or str(handler)


def describe_handler(handler):
    stream = getattr(handler, "stream", None)
    return {
        "type": type(handler).__qualname__,
        "level": handler.level,
        "file": getattr(handler, "baseFilename", None),
        "fd": stream.fileno() if hasattr(stream, "fileno") and not stream.closed else None,
    }


def configured(logger):
    """What a logger has beyond a fresh one: handlers, a level, filters, no propagation."""
    return {
        "level": logger.level,
        "handlers": [describe_handler(h) for h in logger.handlers],
        "filters": len(logger.filters),
        "propagate": logger.propagate,
        "disabled": logger.disabled,
    }


def descriptors():
    """Every open descriptor above stderr, with what it is (the report channel named)."""
    report = os.environ.get("MLCLUSTER_REPORT", "")
    report_fd = int(report[3:]) if report.startswith("fd:") else None
    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        found[str(fd)] = "report channel" if fd == report_fd else target.split(":")[0]
    return found


loggers = {
    name: configured(logger)
    for name, logger in logging.Logger.manager.loggerDict.items()
    if isinstance(logger, logging.Logger)
    and (logger.handlers or logger.level or logger.filters or not logger.propagate)
}
old_wakeup = signal.set_wakeup_fd(-1)
if old_wakeup != -1:
    signal.set_wakeup_fd(old_wakeup)
finalizers = [
    f"{getattr(info.func, '__module__', '?')}.{getattr(info.func, '__qualname__', '?')}"
    for info in weakref.finalize._registry.values()
    if info.atexit
]
seen = {
    "root": configured(logging.getLogger()),
    "loggers": loggers,
    "live_handlers": sorted(
        type(ref()).__qualname__ for ref in logging._handlerList if ref() is not None
    ),
    "logging_disable": logging.root.manager.disable,
    "captured_warnings": logging._warnings_showwarning is not None,
    "signals": {
        s.name: handler_name(signal.getsignal(s))
        for s in signal.valid_signals()
        if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)
    },
    "blocked_signals": sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "wakeup_fd": old_wakeup,
    "faulthandler": faulthandler.is_enabled(),
    "descriptors": descriptors(),
    "threads": sorted(t.name for t in threading.enumerate()),
    "environ": dict(os.environ),
    "our_modules": sorted(m for m in sys.modules if m.split(".")[0] == "jupyterlab_mlcluster"),
    "atexit_handlers": atexit._ncallbacks(),
    "exit_finalizers": sorted(finalizers),
    "warning_filters": len(warnings.filters),
    "hooks": {
        "excepthook": handler_name(sys.excepthook),
        "threading_excepthook": handler_name(threading.excepthook),
        "displayhook": handler_name(sys.displayhook),
        "trace": sys.gettrace() is not None,
        "profile": sys.getprofile() is not None,
        "meta_path": [
            type(f).__qualname__ if not isinstance(f, type) else f.__qualname__
            for f in sys.meta_path
        ],
    },
    "socket_timeout": socket.getdefaulttimeout(),
    "tempdir_cached": tempfile.tempdir,  # (computed from TMPDIR at first use)
    "umask": os.umask(0o022),
    "torch_threads": torch.get_num_threads(),
    # Who started this rank (not compared: it tells a warm rank from a cold one).
    "parent": open(f"/proc/{os.getppid()}/cmdline").read().split("\0"),
}
os.umask(seen["umask"])
with open(os.path.join(out, f"{tag}-{os.environ['RANK']}.json"), "w") as f:
    json.dump(seen, f)
