"""RBAC for a notebook pod's service account: run mlcluster jobs in its own namespace, no more.

Pure builders (used by the notebook-controller for each user's namespace and by
`deploy/notebook-rbac.yaml`, which `python -m jupyterlab_mlcluster.backends.kubernetes.rbac`
regenerates).

What the Kubernetes backend does, and so what it may do:
- job objects (TrainJob, PyTorchJob, TFJob, Indexed Job), their headless Services and Volcano
  PodGroups:
  create, watch, read back, resume (patch), cancel (delete);
- `<kind>/finalizers` update: required to set `blockOwnerDeletion` on the dependents it owns
  when the OwnerReferencesPermissionEnforcement admission plugin is on;
- payload Secrets: create and delete only. No get/list/watch: reading Secrets back is never
  needed (they are mounted by the job's pods; that one is still the Secret the supervisor
  created is asked with a dry-run delete carrying a uid precondition) and would expose every
  Secret in the namespace;
- pods (read, for per-rank state), pods/log (read), events (read, for `Unschedulable` and
  other reasons), Kueue Workloads and LocalQueues (read, for why and where a job waits), pod
  metrics (read), Kubeflow Trainer runtimes (read: a TrainJob naming a runtime that does not
  exist is refused at submit). ClusterTrainingRuntimes are cluster-scoped: one ClusterRole
  reads them (`trainer_runtime_reader`), bound to each notebook service account.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .objects import LABEL_MANAGED_BY, MANAGED_BY

ROLE_NAME = "mlcluster-jobs"
MANAGE = ["create", "get", "list", "watch", "patch", "delete"]
READ = ["get", "list", "watch"]


def _rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": list(verbs)}


def job_rules() -> list[dict[str, Any]]:
    """What running jobs in one namespace takes (see above): the notebook service account's
    Role, and the shared Jupyter server's in each user namespace (its jobs' supervisors run
    with the server's credentials; notebook_controller/manifests.py)."""
    return [
        _rule("trainer.kubeflow.org", ["trainjobs"], MANAGE),
        _rule("trainer.kubeflow.org", ["trainjobs/finalizers"], ["update"]),
        _rule("trainer.kubeflow.org", ["trainingruntimes"], READ),
        _rule("kubeflow.org", ["pytorchjobs", "tfjobs"], MANAGE),
        _rule("kubeflow.org", ["pytorchjobs/finalizers", "tfjobs/finalizers"], ["update"]),
        _rule("batch", ["jobs"], MANAGE),
        _rule("batch", ["jobs/finalizers"], ["update"]),
        _rule("", ["services"], MANAGE),
        _rule("scheduling.volcano.sh", ["podgroups"], MANAGE),
        _rule("", ["secrets"], ["create", "delete"]),
        _rule("", ["pods"], READ),
        _rule("", ["pods/log"], ["get"]),
        _rule("", ["events"], READ),
        _rule("events.k8s.io", ["events"], READ),
        _rule("kueue.x-k8s.io", ["workloads", "localqueues"], READ),
        _rule("metrics.k8s.io", ["pods"], ["get", "list"]),
    ]


def job_runner_role(namespace: str, name: str = ROLE_NAME) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        },
        "rules": job_rules(),
    }


def job_runner_role_binding(
    namespace: str, service_account: str, role_name: str = ROLE_NAME
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": f"{role_name}-{service_account}",
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def service_account(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        },
    }


def notebook_rbac(namespace: str, service_account_name: str) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding, in apply order."""
    return [
        service_account(namespace, service_account_name),
        job_runner_role(namespace),
        job_runner_role_binding(namespace, service_account_name),
    ]


RUNTIME_READER = "mlcluster-trainer-runtime-reader"


def trainer_runtime_reader(
    subjects: list[tuple[str, str]], name: str = RUNTIME_READER
) -> list[dict[str, Any]]:
    """ClusterRole reading ClusterTrainingRuntimes (what a TrainJob may name; nothing secret)
    and its binding to the notebook service accounts `subjects` ((namespace, name) pairs)."""
    labels = {LABEL_MANAGED_BY: MANAGED_BY}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": dict(labels)},
            "rules": [_rule("trainer.kubeflow.org", ["clustertrainingruntimes"], ["get", "list"])],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(labels)},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": account, "namespace": namespace}
                for namespace, account in subjects
            ],
        },
    ]


def main(argv: list[str] | None = None) -> None:
    import yaml

    parser = argparse.ArgumentParser(
        description="Print the RBAC that lets a notebook pod run mlcluster jobs, as YAML."
    )
    parser.add_argument("--namespace", default="default", help="the notebook's namespace")
    parser.add_argument(
        "--service-account", default="mlcluster-notebook", help="the notebook pod's service account"
    )
    args = parser.parse_args(argv)
    objects = notebook_rbac(args.namespace, args.service_account) + trainer_runtime_reader(
        [(args.namespace, args.service_account)]
    )
    sys.stdout.write(
        "# Generated by `python -m jupyterlab_mlcluster.backends.kubernetes.rbac"
        f" --namespace {args.namespace} --service-account {args.service_account}`.\n"
    )
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))


if __name__ == "__main__":
    main()
