"""The kernel as the submitter of its cells' jobs: where a job says it came from (the kernel,
its notebook, the cell's number, the user) and what the warm pool may learn from the
packages the kernel has imported."""

from __future__ import annotations

import os
import sys
from typing import Any

from ..jobs.owner import current_user


class KernelSubmitter:
    """One shell's jobs' origin and preload; a package the warm pool refused is said once
    per kernel, in one line."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.noted_refusals: set[str] = set()

    def origin(self) -> dict[str, Any]:
        origin: dict[str, Any] = {"kind": "kernel"}
        try:
            from ipykernel.connect import get_connection_file

            name = os.path.basename(get_connection_file())
            if name.startswith("kernel-") and name.endswith(".json"):
                origin["kernel_id"] = name[len("kernel-") : -len(".json")]
        except Exception:  # noqa: BLE001 - not in a kernel (terminal IPython)
            origin["kind"] = "ipython"
        # jupyter_server tells kernels which notebook they serve (ipykernel also puts it in
        # the namespace as __session__; VS Code as __vsc_ipynb_file__).
        user_ns = getattr(self.shell, "user_ns", None) or {}
        notebook = (
            os.environ.get("JPY_SESSION_NAME")
            or user_ns.get("__session__")
            or user_ns.get("__vsc_ipynb_file__")
        )
        if isinstance(notebook, str) and notebook:
            origin["notebook"] = notebook
        # The cell's number as the notebook shows it (In [7]): the running execution's result
        # holds it (IPython counts shell.execution_count up before the cell's code runs).
        # Unnamed jobs are named after it (jobs/grouping.py).
        running = getattr(getattr(self.shell, "displayhook", None), "exec_result", None)
        count = getattr(running, "execution_count", None)
        if isinstance(count, int) and count > 0:
            origin["cell"] = count
        origin["user"] = current_user()  # $MLCLUSTER_USER in a notebook pod (jobs/owner.py)
        return origin

    def preload(self, config) -> list[str]:
        """The installed packages this kernel has imported, for the warm pool to learn (it
        preloads them in a new generation, so the next cell's ranks start with them
        imported)."""
        if not (config.warm_pool and config.warm_pool_learn):
            return []
        from ..jobs import warm
        from ..jobs.warm import preload

        learned = preload.kernel_modules()
        refused = warm.refused_modules()
        for top in sorted({name.partition(".")[0] for name in learned} & set(refused)):
            if top not in self.noted_refusals:
                self.noted_refusals.add(top)
                print(f"warm pool: {top} is not preloaded: {refused[top]}", file=sys.stderr)
        return learned
