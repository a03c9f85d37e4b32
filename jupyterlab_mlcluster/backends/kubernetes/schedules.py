"""A schedule on Kubernetes, pure: a `batch/v1 CronJob` and the Secret holding its job.

The cluster fires it, with no notebook server alive: each tick the CronJob controller starts
a pod that runs `mlcluster schedule submit` on the stored spec and payload (mounted from the
Secret), which submits an ordinary job named `<schedule>-<time>` to the kubernetes backend
and follows it to its end, so the CronJob's own Job lasts as long as the run (that is what
its concurrencyPolicy counts) and its pod log is the run's output.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from ...jobs.model import SpecError
from .objects import LABEL_MANAGED_BY, MANAGED_BY, label_value

MOUNT_PATH = "/var/run/mlcluster/schedule"
LABEL_SCHEDULE = "mlcluster.io/schedule"
LABEL_OWNER = "mlcluster.io/user"
# The CronJob records which Secret (name and uid) holds its job: that name is unguessable, so
# nobody can pre-create it, and only the Secret with that uid is ever deleted as ours.
ANNOTATION_SECRET = "mlcluster.io/schedule-secret"
ANNOTATION_SECRET_UID = "mlcluster.io/schedule-secret-uid"
# A Secret holds at most 1 MiB; leave room for its metadata.
MAX_SECRET_BYTES = 1024 * 1024 - 16 * 1024


def object_name(schedule: str) -> str:
    """CronJob and Secret name: `mlcluster-<schedule>` (a CronJob name has at most 52)."""
    return f"mlcluster-{schedule}"


def new_secret_name(schedule: str) -> str:
    """A fresh, unguessable Secret name: `mlcluster-<schedule>` could be pre-created by
    another user of the namespace to have their code run as the schedule's job."""
    return f"mlcluster-{schedule}-{secrets.token_hex(8)}"


def schedule_labels(schedule: str, owner: str | None) -> dict[str, str]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SCHEDULE: schedule}
    if owner:
        labels[LABEL_OWNER] = label_value(owner)
    return labels


def submit_command(schedule: str, timezone: str, mount_path: str = MOUNT_PATH) -> list[str]:
    """What the CronJob's pod runs: submit the stored job, follow it, exit with its outcome."""
    return [
        "mlcluster",
        "schedule",
        "submit",
        "--schedule",
        schedule,
        "--timezone",
        timezone,
        "--spec",
        f"{mount_path}/spec.json",
        "--payload",
        f"{mount_path}/payload.pkl",
    ]


def schedule_secret(
    row: dict[str, Any], payload: bytes, *, namespace: str, name: str
) -> dict[str, Any]:
    """The job's spec and payload (pushed variables may be secrets: a Secret, not a ConfigMap)."""
    if len(payload) > MAX_SECRET_BYTES:
        raise SpecError(
            f"the scheduled job's code and pushed variables take {len(payload)} bytes; a "
            f"Kubernetes schedule holds at most {MAX_SECRET_BYTES} (push less, or load data "
            "from storage inside the job)"
        )
    spec = dict(row["spec"], backend="kubernetes")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": schedule_labels(row["name"], row.get("owner")),
        },
        "type": "Opaque",
        "data": {
            "spec.json": base64.b64encode(json.dumps(spec).encode()).decode(),
            "payload.pkl": base64.b64encode(payload).decode(),
        },
    }


def schedule_cronjob(
    row: dict[str, Any],
    *,
    namespace: str,
    image: str,
    secret: dict[str, Any],
    service_account: str | None = None,
    mount_path: str = MOUNT_PATH,
) -> dict[str, Any]:
    """The CronJob of a schedule row (jobs/experiments/store.py), its policies one for one;
    `secret` is the created Secret holding its job (its name and uid are recorded)."""
    secret_name = secret["metadata"]["name"]
    name = object_name(row["name"])
    labels = schedule_labels(row["name"], row.get("owner"))
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "submit",
                "image": image,
                "command": submit_command(row["name"], row["timezone"], mount_path),
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "volumeMounts": [{"name": "schedule", "mountPath": mount_path, "readOnly": True}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "1Gi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [
            {"name": "schedule", "secret": {"secretName": secret_name, "defaultMode": 0o440}}
        ],
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    spec: dict[str, Any] = {
        "schedule": row["cron"],
        "timeZone": row["timezone"],
        "concurrencyPolicy": row["concurrency"],
        "suspend": bool(row.get("suspended")),
        "successfulJobsHistoryLimit": int(row["successful_history"]),
        "failedJobsHistoryLimit": int(row["failed_history"]),
        "jobTemplate": {
            "metadata": {"labels": dict(labels)},
            "spec": {
                # The run is the job it submits: a failed run is not retried by a new pod.
                "backoffLimit": 0,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        },
    }
    if row.get("starting_deadline") is not None:
        spec["startingDeadlineSeconds"] = max(1, int(row["starting_deadline"]))
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                ANNOTATION_SECRET: secret_name,
                ANNOTATION_SECRET_UID: secret["metadata"].get("uid", ""),
            },
        },
        "spec": spec,
    }
