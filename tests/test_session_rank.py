"""A session rank's bookkeeping between cells, in-process (runtime/session_worker.py): which
modules count as the notebook's own, whose edits the next cell imports afresh. The kernel
tests (tests/kernel/test_sessions.py) run the same through real sessions."""

from __future__ import annotations

import importlib
import os
import sys
import time

from jupyterlab_mlcluster.runtime.payload import Payload
from jupyterlab_mlcluster.runtime.session_worker import SessionRank, _local_dirs

LOCAL, INSTALLED = "mlcb_notebook_helper", "mlcb_installed_package"


def test_only_the_notebooks_own_modules_are_imported_afresh_after_an_edit(tmp_path, monkeypatch):
    # A project with its virtual environment inside it, as `python -m venv .venv` makes one:
    # its installed packages lie under the notebook's directory, and are still not its own.
    project = tmp_path / "project"
    site = project / ".venv" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (project / f"{LOCAL}.py").write_text("VERSION = 1\n")
    (site / f"{INSTALLED}.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(project))
    for name in (LOCAL, INSTALLED):
        monkeypatch.delitem(sys.modules, name, raising=False)
    read_end, write_end = os.pipe()
    os.close(write_end)
    rank = SessionRank(read_end)
    try:
        payload = Payload(kind="code", source="", cwd=str(project), sys_path=[str(project)])
        rank.local_dirs = _local_dirs(payload)
        assert importlib.import_module(LOCAL).VERSION == 1  # what a cell's `import` does
        assert importlib.import_module(INSTALLED).VERSION == 1
        rank.remember_local_modules()
        assert set(rank.local_modules) == {LOCAL}

        later = time.time() + 5
        for path in (project / f"{LOCAL}.py", site / f"{INSTALLED}.py"):
            path.write_text("VERSION = 2\n")
            os.utime(path, (later, later))
        rank.forget_changed_local_modules()  # the next cell starts
        assert LOCAL not in sys.modules and INSTALLED in sys.modules
        assert importlib.import_module(LOCAL).VERSION == 2
        rank.remember_local_modules()  # the fresh import is watched again
        assert set(rank.local_modules) == {LOCAL}
        (project / f"{LOCAL}.py").write_text("VERSION = 3\n")
        os.utime(project / f"{LOCAL}.py", (later + 5, later + 5))
        rank.forget_changed_local_modules()
        assert importlib.import_module(LOCAL).VERSION == 3
    finally:
        rank.commands.close()
        for name in (LOCAL, INSTALLED):
            sys.modules.pop(name, None)
