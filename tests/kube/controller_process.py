"""Real controller processes, started fast: forked from a zygote that imported them once.

Importing kopf and the kubernetes client takes seconds; a test that kills the controller
(SIGKILL) and restarts it many times forks each new controller from one process that already
imported everything. Each child is a real, separate process (own session, own event loop)
running ``notebook_controller.cli.run_controller(argv)``, exactly what ``mlcluster controller``
runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import stop_process

_ZYGOTE = r"""
import json, os, signal, sys
import notebook_controller.cli, notebook_controller.handlers  # the slow imports, once
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        log = os.open(request['log'], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = 1
        try:
            code = notebook_controller.cli.run_controller(request['argv'])
        finally:
            os._exit(code)
    sys.stdout.write(f'{pid}\n')
    sys.stdout.flush()
"""


class ControllerZygote:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        root = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        )
        self.children: list[int] = []

    def spawn(self, argv: list[str], log: Path) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
        self.process.stdin.flush()
        pid = int(self.process.stdout.readline())
        self.children.append(pid)
        return pid

    @staticmethod
    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self, pid: int, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while self.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        for pid in self.children:
            self.kill(pid, signal.SIGTERM, timeout=5)
            self.kill(pid)
        if self.process.stdin is not None:
            self.process.stdin.close()
        stop_process(self.process, grace=10)
