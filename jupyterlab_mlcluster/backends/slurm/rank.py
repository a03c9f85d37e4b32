"""What each task of a Slurm job step runs: `python -m jupyterlab_mlcluster.backends.slurm.rank`.

It turns Slurm's task variables into the rank's torchrun environment (script.rank_environment),
opens the rank's report file (its signed records: started, progress, errors, and its own CPU,
memory and GPU figures, as a pod's rank reports them), runs the same worker as every
backend, and leaves its exit status in a file beside its output so the supervisor knows how
each rank ended (a task killed by a signal leaves none: it was stopped).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from ...runtime.atomic import write_whole
from ...runtime.stackdump import STACKS_FILE_ENV
from . import script


def add_job_variables(attempt_dir: str) -> None:
    """Add the job's variables (script.variables_file) to this task's environment; when one
    the interpreter reads at start-up changes (PYTHONPATH, LD_PRELOAD...), start again with
    them, as a local rank would have started."""
    with open(script.variables_file(attempt_dir)) as f:
        variables = json.load(f)
    restart = any(
        k.startswith(script.STARTUP_PREFIXES) and os.environ.get(k) != v
        for k, v in variables.items()
    )
    os.environ.update(variables)
    if restart:
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", __spec__.name])


def main() -> None:
    attempt_dir = os.environ["MLCLUSTER_SLURM_ATTEMPT_DIR"]
    add_job_variables(attempt_dir)
    os.environ.update(script.rank_environment(dict(os.environ), attempt_dir))
    rank = int(os.environ["RANK"])
    report = os.open(
        script.rank_file(attempt_dir, rank, "control"),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
        0o600,
    )
    os.environ["MLCLUSTER_REPORT"] = f"fd:{report}"
    if os.environ.pop(script.STACKS_HELPER_VARIABLE, "") == "1":
        # The rank's own stack helper (runtime/stackdump.py, armed by the worker), woken by
        # scancel --signal=USR2 where py-spy cannot read this task (forensics.py).
        os.environ[STACKS_FILE_ENV] = script.rank_file(attempt_dir, rank, "stacks")
    from ...runtime import metrics, worker

    # Nobody samples a task on its node from outside: it reports its own CPU, memory and
    # GPU figures, as a pod's rank does.
    metrics.start_reporting()

    status: int | str | None = 1
    try:
        worker.main()
        status = 0
    except SystemExit as exc:
        status = exc.code if exc.code is not None else 0
        raise
    finally:
        code = status if isinstance(status, int) else 1
        path = script.rank_file(attempt_dir, rank, "exit")
        with contextlib.suppress(OSError):
            write_whole(path, str(code))


if __name__ == "__main__":
    main()
