"""A fork of the kernel waits for the extension's background threads (kernel/extension.py):
a child forked while one of them imports would find that module's import lock held
forever."""

from __future__ import annotations

import os
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
        from jupyterlab_mlcluster.kernel.extension import KernelExtension

        done = []
        background = KernelExtension.in_this_process().background
        background.start(lambda: (time.sleep(0.3), done.append(1)), name="t")
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


@pytest.mark.slow
def test_the_fork_hook_is_registered_by_the_first_load_only(tmp_path):
    # Importing the magics registers nothing (a process that never loads the extension keeps
    # no hook of ours); loading it registers one, and a reload none more.
    script = textwrap.dedent(
        """
        import os

        ours = []
        register = os.register_at_fork

        def counting(**hooks):
            if getattr(hooks.get("before"), "__module__", "").startswith("jupyterlab_mlcluster"):
                ours.append(hooks)
            register(**hooks)

        os.register_at_fork = counting
        from IPython.core.interactiveshell import InteractiveShell
        from jupyterlab_mlcluster.kernel import magics

        print("at import:", len(ours))
        shell = InteractiveShell.instance()
        magics.load_ipython_extension(shell)
        magics.unload_ipython_extension(shell)
        magics.load_ipython_extension(shell)
        print("after a load and a reload:", len(ours))
        """
    )
    env = {**os.environ, "MLCLUSTER_STORE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "at import: 0\nafter a load and a reload: 1\n" in out.stdout, out.stdout + out.stderr
