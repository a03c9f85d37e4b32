"""The CLI's check before an export is written: the pushed variables load again, here, as
the exported script will load them (in the job's working directory and sys.path). It
unpickles the job's own payload, as its owner: never called by a server (which never
unpickles anything, tests/server/test_no_unpickling.py)."""

from __future__ import annotations

import os
import sys

from ..runtime.payload import Payload, PayloadError
from .build import ExportError, JobMaterial


def check_variables(material: JobMaterial) -> None:
    """ExportError naming what fails when the pushed variables (of the job, or of an
    earlier cell of its session) cannot be loaded again."""
    for part in (*material.earlier, material):
        _check(part)


def _check(material: JobMaterial) -> None:
    if material.variables is None:
        return
    job_id = material.record.id
    saved_path, saved_cwd = list(sys.path), os.getcwd()
    try:
        payload = Payload.loads(material.variables)
        if payload.cwd and os.path.isdir(payload.cwd):
            os.chdir(payload.cwd)
        sys.path[:0] = [p for p in payload.sys_path if p not in sys.path]
        payload.unpack()
    except PayloadError as exc:
        raise ExportError(
            f"job {job_id}'s pushed variables cannot be saved: the script could not load them "
            f"({exc})"
        ) from None
    finally:
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
