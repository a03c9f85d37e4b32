"""Where a job's files are in the store's root: the layout every process shares (store.py's
docstring draws it), and the staging directories of submissions in progress."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .jobids import check_job_id

# A submission's files are written here, then renamed to jobs/<id> in the transaction that
# inserts its row; one left by a submitter that died in between is removed after this long.
STAGING_PREFIX = ".new-"
STAGING_STALE = 600.0


class JobFiles:
    """The job directories under one store root (JobStore adds the database to them)."""

    def __init__(self, root: Path):
        self.root = root

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / check_job_id(job_id)

    def read_launch(self, job_id: str) -> dict[str, Any]:
        """The job's launch.json (what its submitter settled: the ranks' environment and
        working directory, its settings); a job stored without one runs with this
        process's environment and directory."""
        try:
            return json.loads((self.job_dir(job_id) / "launch.json").read_text())
        except FileNotFoundError:
            return {"env": dict(os.environ), "cwd": os.getcwd()}

    def tensorboard_dir(self, job_id: str) -> Path:
        """Where a local job's ranks write TensorBoard data by default
        ($MLCLUSTER_TENSORBOARD_DIR, unless the job's env names another)."""
        return self.job_dir(job_id) / "tensorboard"

    def payload_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "payload.pkl"

    def result_path(self, job_id: str) -> Path:
        """Rank 0's result pickled: only the owner's kernel or process may load it."""
        return self.job_dir(job_id) / "result.pkl"

    def result_json_path(self, job_id: str) -> Path:
        """Rank 0's result as data: its JSON form, or the types that have none (what servers
        read: they never unpickle). Ranks write it beside result_path()."""
        return self.result_path(job_id).with_name("result.json")

    def error_path(self, job_id: str, rank: int) -> Path:
        return self.job_dir(job_id) / f"error-{int(rank)}.json"

    def log_dir(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "logs"

    def log_path(self, job_id: str, rank: int) -> Path:
        return self.log_dir(job_id) / f"rank-{int(rank)}.log"

    def remove_stale_staging(self, older_than: float = STAGING_STALE) -> list[str]:
        """Staging directories of submissions whose submitter died before finishing."""
        removed = []
        cutoff = time.time() - older_than
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root / "jobs"):
                if entry.name.startswith(STAGING_PREFIX):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            shutil.rmtree(entry.path, ignore_errors=True)
                            removed.append(entry.name)
        return removed
