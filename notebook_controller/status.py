"""A Notebook's status, computed from its StatefulSet and pod (level-based: same in, same
out). What the REST API and the sidebar show of it is notebook_resource.py's
`notebook_status_summary`, shared with the server. Pure: no API calls here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyterlab_mlcluster.notebook_resource import (  # noqa: F401 - shown by the REST API
    notebook_status_summary,
)

from .objects import ANNOTATION_STOPPED, is_stopped, notebook_url

ERROR_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def _condition(pod: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return {}


def _waiting(pod: Mapping[str, Any] | None) -> Mapping[str, Any]:
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting:
            return waiting
    return {}


def _phase_and_message(
    notebook: Mapping[str, Any],
    sts: Mapping[str, Any] | None,
    pod: Mapping[str, Any] | None,
    error: str | None,
) -> tuple[str, str, bool]:
    if error:
        return f"error: {error}", error, False
    if is_stopped(notebook):
        since = notebook["metadata"]["annotations"][ANNOTATION_STOPPED]
        return "stopped", "stopping" if pod is not None else f"stopped since {since}", False
    pod_status = (pod or {}).get("status") or {}
    if pod_status.get("phase") == "Failed":
        why = pod_status.get("message") or pod_status.get("reason") or "the pod failed"
        return f"error: {why}", why, False
    waiting = _waiting(pod)
    if waiting.get("reason") in ERROR_WAITING_REASONS:
        why = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        return f"error: {why}", why, False
    ready = _condition(pod, "Ready").get("status") == "True"
    if ready:
        return "ready", "ready", True
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False":
        return (
            "starting",
            f"{scheduled.get('reason', 'Unschedulable')}: {scheduled.get('message', '')}",
            False,
        )
    if waiting:
        return "starting", waiting.get("message") or waiting.get("reason", "starting"), False
    if pod is None:
        return "starting", "waiting for the notebook pod to be created", False
    if pod_status.get("phase") == "Running":
        return "starting", "waiting for JupyterLab to answer", False
    return "starting", "waiting for the pod to start", False


def compute_status(
    notebook: Mapping[str, Any],
    sts: Mapping[str, Any] | None,
    pod: Mapping[str, Any] | None,
    error: str | None = None,
) -> dict[str, Any]:
    """The Notebook's status from its StatefulSet and pod (level-based: same in, same out)."""
    meta = notebook["metadata"]
    phase, message, ready = _phase_and_message(notebook, sts, pod, error)
    old = notebook.get("status") or {}
    old_conditions = {c["type"]: c for c in old.get("conditions") or []}
    conditions = []
    for source in ((pod or {}).get("status") or {}).get("conditions") or []:
        condition = {
            k: source[k]
            for k in ("type", "status", "reason", "message", "lastTransitionTime")
            if source.get(k) is not None
        }
        conditions.append(condition)
    if not any(c["type"] == "Ready" for c in conditions):
        previous = old_conditions.get("Ready", {})
        condition = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "Stopped"
            if is_stopped(notebook)
            else ("Error" if phase.startswith("error") else "Starting"),
        }
        if previous.get("status") == condition["status"] and previous.get("lastTransitionTime"):
            condition["lastTransitionTime"] = previous["lastTransitionTime"]
        conditions.append(condition)
    status: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "ready": ready,
        "url": notebook_url(meta["namespace"], meta["name"]),
        "readyReplicas": int(((sts or {}).get("status") or {}).get("readyReplicas") or 0),
        "observedGeneration": int(meta.get("generation", 1)),
        "conditions": conditions,
    }
    waiting = _waiting(pod)
    if waiting:
        status["containerState"] = {"waiting": dict(waiting)}
    if old.get("lastActivity"):
        status["lastActivity"] = old["lastActivity"]
    return status


def status_changed(notebook: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether writing ``status`` would change anything (condition timestamps aside)."""

    def essence(value: Mapping[str, Any]) -> Any:
        return {
            **value,
            "conditions": [
                {k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in value.get("conditions") or []
            ],
        }

    return essence(notebook.get("status") or {}) != essence(status)
