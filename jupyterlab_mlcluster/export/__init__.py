"""Take a job away (`mlcluster export JOB --as TARGET -o DIR`, POST /jobs/{id}/export): what
runs it again outside the notebook. `build.py` makes the files from what the store kept;
here they are read (`job_material`) and written (`write_export`): all of them or none, so
a refused export leaves no half-written directory behind."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from ..jobs.grouping import cell_label
from ..jobs.model import JobState
from ..jobs.provenance import MAX_SCRIPT_BYTES, SCRIPT_FILE
from ..jobs.storage.store import UnknownJob
from ..runtime.payload import PayloadError, read_payload_bytes
from .build import TARGETS, ExportError, JobMaterial, build

PROVENANCE = "provenance.json"  # what the job kept for its export (jobs/service.py)

__all__ = ["TARGETS", "ExportError", "export_files", "export_zip", "job_material", "write_export"]


def job_material(service: Any, ref: str, owner: str | None = None) -> JobMaterial:
    """What the store kept of job `ref` (an id or name; `owner`: only among that user's
    jobs), read without unpickling anything (a shared server calls it); a session's cell
    with the cells that succeeded in its session before it. ExportError when its code or
    its pushed variables cannot be had."""
    try:
        record = service.get(ref, owner=owner)
    except (UnknownJob, KeyError):
        raise ExportError(f"no job {ref!r}") from None
    material = _material(service.store, record)
    session_job = record.origin.get("session_job")
    if session_job:
        cells, _ = service.store.list_jobs(parent=session_job, owner=owner)
        material.earlier = [
            _material(service.store, cell)
            for cell in sorted(cells, key=lambda c: c.created)
            if cell.created < record.created and cell.state == JobState.SUCCEEDED
        ]
    return material


def _material(store: Any, record: Any) -> JobMaterial:
    job_dir = store.job_dir(record.id)
    kept = _read_json(job_dir / PROVENANCE)
    kind = kept.get("kind") or ("code" if (job_dir / "cell.py").is_file() else "")
    if kind == "code":
        try:
            # Padded with blank lines to the cell's own numbering (jobs/service.py).
            source = (job_dir / "cell.py").read_text(encoding="utf-8").lstrip("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise ExportError(f"job {record.id}'s code is not readable: {exc}") from None
        label = cell_label(record.origin) or "a cell"
    elif kind == "script":
        filename = str(kept.get("filename") or "")
        try:  # as submitted: the file may have been edited since
            source = (job_dir / SCRIPT_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ExportError(
                f"job {record.id} ran the script {filename}, whose text was not kept when it "
                f"was submitted (unreadable then, over {MAX_SCRIPT_BYTES >> 20} MiB, or by an "
                "earlier version): what it ran cannot be had"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ExportError(f"job {record.id}'s script is not readable: {exc}") from None
        label = filename
    else:
        raise ExportError(
            f"job {record.id} ran {('a ' + kind) if kind else 'code this version did not record'}"
            "; only cells and scripts can be exported"
        )
    variables = None
    if kept.get("pushed"):
        try:
            variables = read_payload_bytes(store.payload_path(record.id))
        except (OSError, PayloadError) as exc:
            raise ExportError(
                f"job {record.id}'s pushed variables ({', '.join(kept['pushed'])}) cannot be "
                f"saved: its stored payload is not readable ({exc})"
            ) from None
    launch = _read_json(job_dir / "launch.json")
    return JobMaterial(
        record=record,
        source=source,
        variables=variables,
        pushed=[str(name) for name in kept.get("pushed") or []],
        requirements=[str(r) for r in kept.get("requirements") or []],
        python=str(kept.get("executable") or "python3"),
        config=dict(launch.get("config") or {}),
        label=label,
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def export_files(
    service: Any, ref: str, target: str, *, owner: str | None = None, image: str | None = None
) -> dict[str, bytes]:
    """The files of job `ref`'s export as `target` (nothing written)."""
    if target not in TARGETS:  # before the job is read: nothing to load for a wrong target
        raise ExportError(f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")
    return build(job_material(service, ref, owner), target, image=image)


def export_zip(files: dict[str, bytes]) -> bytes:
    """The files as one zip (POST /jobs/{id}/export); scripts executable."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in sorted(files.items()):
            info = zipfile.ZipInfo(name)
            info.external_attr = (_mode(name) | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, content)
    return buffer.getvalue()


def _mode(name: str) -> int:
    if name.endswith(".pkl"):
        return 0o600  # what the user pushed: theirs alone, as in the job store
    return 0o755 if name.endswith((".sh", ".sbatch", ".py")) else 0o644


def write_export(files: dict[str, bytes], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write `files` into `out_dir`, a new or empty directory: into a sibling first, renamed
    into place once all are written, so it holds all of them or is as it was."""
    target = Path(out_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ExportError(f"{target} exists and is not an empty directory; nothing written")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ExportError(f"{parent} is not a directory; nothing written")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        for name, content in files.items():
            path = staging / name
            path.write_bytes(content)
            path.chmod(_mode(name))
        staging.chmod(0o755)
        if target.exists():
            target.rmdir()  # empty (checked above): replaced by the whole export
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [target / name for name in sorted(files)]
