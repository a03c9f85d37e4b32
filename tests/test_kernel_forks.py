"""A fork of the kernel waits for the extension's background threads (kernel/magics.py):
a child forked while one of them imports would find that module's import lock held
forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow
def test_a_fork_waits_for_the_extensions_background_threads():
    # In a process of its own (the hook is process-wide): a background thread that ends
    # 0.3 s after it starts; the fork, asked at once, must come after it.
    script = textwrap.dedent(
        """
        import os, time
        from jupyterlab_mlcluster.kernel import magics

        done = []
        magics._start_background(lambda: (time.sleep(0.3), done.append(1)), name="t")
        pid = os.fork()
        if pid == 0:
            os._exit(0 if done else 1)
        _, status = os.waitpid(pid, 0)
        print("child saw the thread done:", os.waitstatus_to_exitcode(status) == 0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "child saw the thread done: True" in out.stdout, out.stdout + out.stderr
