"""The names and labels of a job's Kubernetes objects, and who owns them: pure functions.

Every object of a job is named `object_name(...)` and carries `job_labels(...)`, so one
label selector (`job_selector`) finds all of them and their pods; a dependent is owned by the
job object (`with_owner`), so deleting that one removes the rest.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

from .labels import LABEL_JOB_ID, LABEL_MANAGED_BY, LABEL_USER, MANAGED_BY

# Pods and per-pod Services of the operator are named <job>-worker-<index> and must be
# DNS-1035 labels (63): 50 + len("-worker-") + 5 digits = 63. Indexed Job pod hostnames
# <job>-<index> fit as well.
MAX_NAME_LENGTH = 50

_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def object_name(job_id: str, name: str | None = None) -> str:
    """The name of every object of a job: `<name>-<job id>`, a DNS-1035 label <= 50 chars.

    The job id keeps it unique; the user's name (truncated to fit) keeps it readable.
    """
    base = f"{name}-{job_id}" if name else job_id
    if len(base) > MAX_NAME_LENGTH and name and len(job_id) < MAX_NAME_LENGTH - 1:
        base = f"{name[: MAX_NAME_LENGTH - len(job_id) - 1].rstrip('-')}-{job_id}"
    if len(base) <= MAX_NAME_LENGTH and _DNS_1035_RE.match(base):
        return base
    # Too long, or no DNS-1035 label (Service names must start with a letter, no trailing
    # '-'): keep what fits, unique through a hash of the whole.
    stem = base[: MAX_NAME_LENGTH - 11].strip("-")
    return "-".join(part for part in ("j", stem, _short_hash(base)) if part)


def label_value(text: str) -> str:
    """`text` as a valid label value; changed text gets a hash so distinct texts stay distinct."""
    if _LABEL_VALUE_RE.match(text) and len(text) <= 63:
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")[:54].rstrip("-_.")
    return f"{cleaned}-{_short_hash(text)}" if cleaned else _short_hash(text)


def job_labels(job_id: str, user: str) -> dict[str, str]:
    """The labels on every object of a job (and its pods): who made it, which job."""
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB_ID: label_value(job_id),
        LABEL_USER: label_value(user),
    }


def job_selector(job_id: str) -> str:
    """Label selector for everything of one job (objects and pods)."""
    return f"{LABEL_JOB_ID}={label_value(job_id)}"


def object_metadata(
    name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def with_owner(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` owned by `owner` (as returned by the API server: it has a uid).

    blockOwnerDeletion makes foreground deletion of the owner wait for this object.
    """
    meta = owner.get("metadata", {})
    if not meta.get("uid") or not meta.get("name"):
        raise ValueError("the owner has no metadata.uid/name yet: pass the object the API returned")
    owned = copy.deepcopy(obj)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return owned
