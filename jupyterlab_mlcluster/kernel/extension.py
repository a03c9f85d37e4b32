"""What loading the extension starts in the kernel's process, once per process however often
it is loaded: its background threads (the first cell's imports, the import learner) and the
fork hook that waits for them. Nothing of it exists before the extension loads."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, ClassVar

logger = logging.getLogger("jupyterlab_mlcluster")

# What a first %%distributed cell would otherwise import on the way (its submit, the local
# backend, the monitor, the payload's pickler: ~30-40 ms measured in a kernel), imported
# in the background as the extension loads, so the first cell costs what the next ones do.
_FIRST_CELL_MODULES = (
    "cloudpickle",
    "jupyterlab_mlcluster.jobs.service",
    "jupyterlab_mlcluster.jobs.storage.watch",
    "jupyterlab_mlcluster.backends.local.backend",
    "jupyterlab_mlcluster.kernel.monitor",
)


class BackgroundThreads:
    """The extension's threads in the kernel. A fork of the kernel (accelerate's
    notebook_launcher, multiprocessing's 'fork') waits for them first, at most FORK_WAIT: a
    thread caught importing holds that module's import lock, which the forked child finds
    held forever (CPython re-creates only the global import lock in a child), so a child
    importing the same module would hang."""

    FORK_WAIT = 5.0

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def start(self, target, *args: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads[:] = [t for t in self.threads if t.is_alive()]
        self.threads.append(thread)
        thread.start()
        return thread

    def wait_before_fork(self) -> None:
        deadline = time.monotonic() + self.FORK_WAIT
        me = threading.current_thread()
        for thread in list(self.threads):
            if thread is not me:
                thread.join(max(0.0, deadline - time.monotonic()))


class KernelExtension:
    """The extension in this process: made by its first load, which registers the fork hook
    (process-wide, and never undone: a second load, or a reload, registers nothing more)."""

    _in_this_process: ClassVar[KernelExtension | None] = None

    def __init__(self) -> None:
        self.background = BackgroundThreads()
        os.register_at_fork(before=self.background.wait_before_fork)

    @classmethod
    def in_this_process(cls) -> KernelExtension:
        if cls._in_this_process is None:
            cls._in_this_process = cls()
        return cls._in_this_process

    def load(self, ipython) -> None:
        """The import learner after each cell, and the first cell's imports now."""
        callbacks = ipython.events.callbacks["post_run_cell"]
        if not any(isinstance(f, ImportLearner) for f in callbacks):
            ipython.events.register("post_run_cell", ImportLearner(ipython, self.background))
        self.background.start(self._record_environment, name="mlcluster-baseline")

    @staticmethod
    def unload(ipython) -> None:
        for callback in list(ipython.events.callbacks["post_run_cell"]):
            if isinstance(callback, ImportLearner):
                ipython.events.unregister("post_run_cell", callback)

    @staticmethod
    def _record_environment() -> None:
        """The first cell's imports, then the kernel's environment as its pod started (if no
        one recorded it yet): Kubernetes jobs' pods install what is pip-installed into it
        later (environment.py)."""
        import importlib

        for name in _FIRST_CELL_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an import the cell will then try (and report)
                logger.debug("not preimported: %s", name)

        from .. import environment
        from ..config import MLClusterConfig

        try:
            environment.record_baseline(MLClusterConfig().store_dir)
        except Exception:  # never in the way of the magics; nothing synced then
            logger.debug("baseline not recorded", exc_info=True)


class ImportLearner:
    """After each cell: if the kernel imported something since the last look, the warm pool
    may build a generation with it now, in a thread (a cell's reply never waits for it), so
    that the first %%distributed cell after `import transformers` is served warm."""

    def __init__(self, ipython, background: BackgroundThreads):
        self.ipython = ipython
        self.background = background
        self.seen = len(sys.modules)
        self.thread: threading.Thread | None = None

    def __call__(self, _result=None) -> None:
        if len(sys.modules) == self.seen or (self.thread and self.thread.is_alive()):
            return
        self.seen = len(sys.modules)
        magics = self.ipython.magics_manager.registry.get("DistributedMagics")
        if magics is None:
            return
        config = magics.service.config
        if not (config.warm_pool and config.warm_pool_learn):
            return
        self.thread = self.background.start(self._learn, config, name="mlcluster-learn")

    @staticmethod
    def _learn(config) -> None:
        from ..jobs import warm
        from ..jobs.warm import preload

        try:
            warm.learn_ahead(config, preload.kernel_modules())
        except Exception:  # never in the user's way; the next job learns
            logger.debug("not learned", exc_info=True)
