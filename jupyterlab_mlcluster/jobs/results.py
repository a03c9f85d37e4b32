"""A job's result, as its ranks left it in the job's directory: rank 0's value pickled
(result.pkl, for the owner's own process only) and its JSON form beside it (result.json,
what servers read: they never unpickle)."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, BinaryIO

from ..config import MLClusterConfig
from .storage.store import JobStore

log = logging.getLogger("jupyterlab_mlcluster.service")

MIB = 1024 * 1024
# How a stored JSON form with a value begins: what runtime/outcome.result_json writes.
JSON_FORM_HEAD = re.compile(rb'\{"kind": "[A-Za-z_]{1,32}", "value": ')
JSON_FORM_HEAD_BYTES = 64


def _why_no_json_form(text: bytes) -> str:
    """Why a stored JSON form has no value to serve: the types it names, what its writer
    refused, or that it is not readable."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return "its JSON form is not readable"
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return "its JSON form is not readable"
    if data.get("refused"):
        return str(data["refused"])[:500]
    return f"{str(data.get('types') or 'its value')[:500]} has no JSON form"


class NoJSONForm(ValueError):
    """A job's result has no JSON form a server may serve (it is read in Python only)."""


class JobResults:
    """The results of the jobs of one store, read under one process's settings."""

    def __init__(self, store: JobStore, config: MLClusterConfig):
        self.store = store
        self.config = config

    def unpickle(self, job_id: str) -> tuple[str, Any]:
        """("value", v) / ("pull", {name: v}) / ("none", None) of a succeeded job, unpickled:
        for the job owner's own kernel or process only (unpickling runs whatever the job's
        code put in it). Servers read as_data()."""
        import cloudpickle

        path = self.store.result_path(job_id)
        if not path.exists():
            return "none", None
        data = cloudpickle.loads(path.read_bytes())
        return data["kind"], data["value"]

    def hand_over(self, job_id: str) -> tuple[str, Any]:
        """unpickle(), then the result leaves the store: the cell that ran the job delivers
        it into its kernel, and a copy left in the store (a 100 MB pull, say) would only
        hold disk and a readable copy of the user's data. Other readers (the REST API, a Job
        handle) unpickle() it and leave it."""
        delivered = self.unpickle(job_id)
        try:
            self.store.drop_result(job_id)
        except Exception as exc:  # noqa: BLE001 - delivered all the same; purge removes it
            log.warning("the result of job %s stays in the store: %s", job_id, exc)
        return delivered

    def as_data(self, job_id: str) -> tuple[str, Any]:
        """The same as unpickle() from the result's JSON form, never unpickling: what a server
        may read of a job it did not write. NoJSONForm where the value has none."""
        f = self.json_file(job_id)
        if f is None:
            return "none", None
        with f:
            text = f.read()
        try:
            data = json.loads(text)  # json_file saw its shape: {"kind", "value"}
            return data["kind"], data["value"]
        except (ValueError, RecursionError, TypeError, KeyError):
            raise NoJSONForm("its JSON form is not readable") from None

    def json_file(self, job_id: str) -> BinaryIO | None:
        """The result's JSON form as stored (`{"kind": ..., "value": ...}`), open at its start
        for a server to stream without decoding it; None when the job returned nothing.
        NoJSONForm where the value has none, or the form is over
        MLClusterConfig.max_result_json_mib (judged by its size, before it is read). Only
        its shape is checked (its head, its last byte): it was written by json.dumps, in the
        job's own rank or its supervisor, and is only ever served to the job's owner."""
        if not self.store.result_path(job_id).exists():
            return None
        try:
            f = open(self.store.result_json_path(job_id), "rb")  # returned
        except FileNotFoundError:
            raise NoJSONForm(
                "the job recorded no JSON form of its result (it ran an older runtime)"
            ) from None
        try:
            size = os.fstat(f.fileno()).st_size
            cap = self.config.max_result_json_mib * MIB
            if cap and size > cap:
                raise NoJSONForm(
                    f"its JSON form is {size / MIB:.1f} MiB, more than this server serves "
                    f"({cap // MIB} MiB, MLClusterConfig.max_result_json_mib)"
                )
            head = f.read(JSON_FORM_HEAD_BYTES)
            f.seek(max(0, size - 64))
            tail = f.read().rstrip()
            if not (JSON_FORM_HEAD.match(head) and tail.endswith(b"}")):
                f.seek(0)
                raise NoJSONForm(_why_no_json_form(f.read()))
            f.seek(0)
            return f
        except BaseException:
            f.close()
            raise
