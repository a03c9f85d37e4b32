"""What a user's pod template may ask of the scheduler (pure; admission.py applies it).

A pod spec decides more than where its own containers run: `priorityClassName:
system-node-critical` preempts other tenants' pods (the system classes outrank every user
class), a `podAffinity`/`podAntiAffinity` term with `namespaces` or a `namespaceSelector`
places the pod next to (or away from) a chosen victim's pods in other namespaces, and a
`schedulerName` or `runtimeClassName` of the user's choosing steps around the gang scheduler
and its queues or onto a runtime the platform did not vet. So each comes from an allow-list
the platform sets (`mlcluster manifests --priority-class`, `--scheduler-name`,
`--allowed-runtime-class`), and affinity terms stay within the pod's own namespace.

The admission policy cannot see a pod that names no priority class but gets a system one by
default (a PriorityClass with `globalDefault`), nor the pods of kinds it does not judge;
`system_priority_quota`, printed in each user namespace, lets no pod of the system classes
exist there at all, whoever made it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_SCHEDULER = "default-scheduler"
# Kubernetes' own classes, above every user class: preempt anyone, evicted last.
SYSTEM_PRIORITY_CLASSES = ["system-node-critical", "system-cluster-critical"]
SYSTEM_PRIORITY_QUOTA = "mlcluster-no-system-priority"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class SchedulingAllowList:
    """What a user's pod may name: PriorityClasses (the values of
    MLClusterConfig.kubernetes_priority_classes, which the Kubernetes backend sets), the one
    scheduler (`volcano` where MLClusterConfig.kubernetes_gang is volcano), RuntimeClasses
    (none by default). A pod that names none of them gets the cluster's defaults."""

    priority_classes: Sequence[str] = ()
    scheduler: str = DEFAULT_SCHEDULER
    runtime_classes: Sequence[str] = ()
    # Volcano queues (cluster-wide objects: any namespace may name any of them) besides
    # Volcano's own `default`.
    queues: Sequence[str] = ()

    def __post_init__(self) -> None:
        names = [*self.priority_classes, self.scheduler, *self.runtime_classes, *self.queues]
        for name in names:
            # Object names (DNS-1123 subdomains): they are written into the policy's CEL.
            if not _NAME.fullmatch(name) or len(name) > 253:
                raise ValueError(f"{name!r} is not the name of a Kubernetes object")
        system = sorted(set(self.priority_classes) & set(SYSTEM_PRIORITY_CLASSES))
        if system:
            raise ValueError(
                f"{', '.join(system)}: a system PriorityClass preempts every tenant's pods and "
                "is never one users' pods may name"
            )


# The allow-lists when the platform sets none: the default scheduler, no chosen class.
DEFAULT_SCHEDULING = SchedulingAllowList()


def _quoted(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _term_stays_home(term: str) -> str:
    """A PodAffinityTerm that looks only at the pod's own namespace (no `namespaces` list,
    no `namespaceSelector`: an empty selector means every namespace)."""
    return (
        f"(!has({term}.namespaces) || size({term}.namespaces) == 0) && "
        f"!has({term}.namespaceSelector)"
    )


def _affinity_stays_home(affinity: str) -> str:
    required = f"{affinity}.requiredDuringSchedulingIgnoredDuringExecution"
    preferred = f"{affinity}.preferredDuringSchedulingIgnoredDuringExecution"
    return (
        f"(!has({affinity}) || ("
        f"(!has({required}) || {required}.all(t, {_term_stays_home('t')})) && "
        f"(!has({preferred}) || {preferred}.all(p, !has(p.podAffinityTerm) || "
        f"{_term_stays_home('p.podAffinityTerm')}))))"
    )


def scheduling_checks(allowed: SchedulingAllowList) -> list[tuple[str, str]]:
    """(CEL over one pod spec `s` that must hold, message) for each rule."""
    classes = list(allowed.priority_classes)
    runtimes = list(allowed.runtime_classes)
    return [
        (
            f"!has(s.priorityClassName) || s.priorityClassName in {_quoted(classes)}",
            "priorityClassName may only be "
            + (", ".join(classes) if classes else "left out (no class is allowed)")
            + " (the platform's classes for job priorities; a system class would preempt "
            "other tenants)",
        ),
        (
            "!has(s.affinity) || ("
            + _affinity_stays_home("s.affinity.podAffinity")
            + " && "
            + _affinity_stays_home("s.affinity.podAntiAffinity")
            + ")",
            "podAffinity and podAntiAffinity terms may not name other namespaces (namespaces, "
            "namespaceSelector): a pod is placed among its own namespace's pods only",
        ),
        (
            f"!has(s.schedulerName) || s.schedulerName == '{allowed.scheduler}'",
            f"schedulerName may only be {allowed.scheduler} (the platform's scheduler and its "
            "queues)",
        ),
        (
            f"!has(s.runtimeClassName) || s.runtimeClassName in {_quoted(runtimes)}",
            "runtimeClassName may only be "
            + (", ".join(runtimes) if runtimes else "left out (no RuntimeClass is allowed)"),
        ),
    ]


def system_priority_quota(namespace: str) -> dict[str, Any]:
    """No pods of the system PriorityClasses in `namespace` (a ResourceQuota scoped to them,
    with none allowed), whatever made them and whatever their template said."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": SYSTEM_PRIORITY_QUOTA, "namespace": namespace},
        "spec": {
            "hard": {"pods": "0"},
            "scopeSelector": {
                "matchExpressions": [
                    {
                        "scopeName": "PriorityClass",
                        "operator": "In",
                        "values": list(SYSTEM_PRIORITY_CLASSES),
                    }
                ]
            },
        },
    }


# --- the group level: what Volcano and Kueue read besides the pod spec ------------------------

GROUP_POLICY_NAME = "mlcluster-group-scheduling"
GROUP_RESOURCES = [
    {
        "apiGroups": ["kubeflow.org"],
        "apiVersions": ["*"],
        "resources": ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs"],
        "operations": ["CREATE", "UPDATE"],
    },
    {
        "apiGroups": [""],
        "apiVersions": ["*"],
        "resources": ["pods"],
        "operations": ["CREATE", "UPDATE"],
    },
    {
        "apiGroups": ["apps"],
        "apiVersions": ["*"],
        "resources": ["deployments", "replicasets", "daemonsets", "statefulsets"],
        "operations": ["CREATE", "UPDATE"],
    },
    {
        "apiGroups": ["scheduling.volcano.sh"],
        "apiVersions": ["*"],
        "resources": ["podgroups"],
        "operations": ["CREATE", "UPDATE"],
    },
    {
        "apiGroups": ["batch"],
        "apiVersions": ["*"],
        "resources": ["jobs", "cronjobs"],
        "operations": ["CREATE", "UPDATE"],
    },
    {
        "apiGroups": ["trainer.kubeflow.org"],
        "apiVersions": ["*"],
        "resources": ["trainjobs"],
        "operations": ["CREATE", "UPDATE"],
    },
]
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Kubeflow's job kinds (training-operator, mpi-operator): each has runPolicy.schedulingPolicy
# and its pod templates under one replica-spec map.
REPLICA_SPECS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
}
KUBEFLOW_JOB_KINDS = list(REPLICA_SPECS)


def replica_specs(pick: str) -> str:
    """CEL: for a Kubeflow job `object`, `pick` (over one replica spec `r`) of each replica
    spec; [] for any other kind."""
    cel = "[]"
    for kind, field in reversed(REPLICA_SPECS.items()):
        where = f"object.spec.{field}"
        picked = f"{where}.map(k, {where}[k]){pick}"
        cel = f"object.kind == '{kind}' ? (has({where}) ? {picked} : []) : {cel}"
    return cel


# The object's own metadata and each pod template's, whatever the kind.
_METAS = (
    "[object.metadata] + ("
    f"object.kind in {KUBEFLOW_JOB_KINDS} ? ("
    + replica_specs(
        ".filter(r, has(r.template) && has(r.template.metadata)).map(r, r.template.metadata)"
    )
    + ") : "
    "object.kind == 'CronJob' ? (has(object.spec.jobTemplate) && "
    "has(object.spec.jobTemplate.spec) && has(object.spec.jobTemplate.spec.template) && "
    "has(object.spec.jobTemplate.spec.template.metadata) ? "
    "[object.spec.jobTemplate.spec.template.metadata] : []) : "
    "object.kind in ['Job', 'Deployment', 'ReplicaSet', 'DaemonSet', 'StatefulSet'] ? "
    "(has(object.spec.template) && has(object.spec.template.metadata) "
    "? [object.spec.template.metadata] : []) : [])"
)


def _meta_ok(meta: str, queues: str, classes: str) -> str:
    """CEL: the metadata map at `meta` (anything with `labels`/`annotations`) names only
    allowed queues and priority classes."""
    return (
        f"[{meta}].all(m, "
        f"(!has(m.annotations) || !('{VOLCANO_QUEUE_ANNOTATION}' in m.annotations) || "
        f"m.annotations['{VOLCANO_QUEUE_ANNOTATION}'] in {queues}) && "
        f"(!has(m.labels) || !('{KUEUE_PRIORITY_LABEL}' in m.labels) || "
        f"m.labels['{KUEUE_PRIORITY_LABEL}'] in {classes}))"
    )


def _trainjob_metas_ok(queues: str, classes: str) -> str:
    """CEL over a TrainJob `object`: every metadata map the Trainer carries to the JobSet,
    its Jobs or their pods (red team pass 2, G3): `spec.labels`/`spec.annotations` (Trainer
    v2.0), `podTemplateOverrides[].metadata` (v2.1), and in each runtime patch (v2.3) the
    JobSet template's, each replicated job's and each pod template's. The same pod specs'
    fields are the pod-template policy's (admission.py)."""
    trs = "p.trainingRuntimeSpec"
    jobs = f"{trs}.template.spec.replicatedJobs"
    pod_meta = "r.template.spec.template.metadata"
    overrides = "object.spec.podTemplateOverrides"
    return (
        "object.kind != 'TrainJob' || !has(object.spec) || ("
        + _meta_ok("object.spec", queues, classes)
        + f" && (!has({overrides}) || {overrides}.all(o, !has(o.metadata) || "
        + _meta_ok("o.metadata", queues, classes)
        + ")) && (!has(object.spec.runtimePatches) || object.spec.runtimePatches.all(p, "
        f"!has({trs}) || !has({trs}.template) || ("
        f"(!has({trs}.template.metadata) || "
        + _meta_ok(f"{trs}.template.metadata", queues, classes)
        + f") && (!has({trs}.template.spec) || !has({jobs}) || {jobs}.all(r, "
        "!has(r.template) || ((!has(r.template.metadata) || "
        + _meta_ok("r.template.metadata", queues, classes)
        + ") && (!has(r.template.spec) || !has(r.template.spec.template) || "
        f"!has({pod_meta}) || " + _meta_ok(pod_meta, queues, classes) + "))))))))"
    )


def group_checks(allowed: SchedulingAllowList) -> list[tuple[str, str]]:
    """(CEL over a job, PodGroup or TrainJob `object`, message): the group-level priority and
    queue fields Volcano and Kueue order and preempt by take the same allow-lists as a pod's
    priorityClassName (red team of issue 31, F3: a PyTorchJob's
    `runPolicy.schedulingPolicy.priorityClass: system-node-critical`, a PodGroup of one's own,
    a queue annotation or Kueue's priority label would go around the pod-spec check)."""
    classes = _quoted(list(allowed.priority_classes))
    queues = _quoted(["default", *allowed.queues])
    policy = "object.spec.runPolicy.schedulingPolicy"
    queue_list = ", ".join(["default", *allowed.queues])
    meta_message = (
        f"{VOLCANO_QUEUE_ANNOTATION} may name only the platform's queues ({queue_list}), "
        f"and {KUEUE_PRIORITY_LABEL} only its priority classes"
    )
    return [
        (
            f"!(object.kind in {KUBEFLOW_JOB_KINDS}) || !has(object.spec.runPolicy) || "
            f"!has({policy}) || ((!has({policy}.priorityClass) || "
            f"{policy}.priorityClass in {classes}) && "
            f"(!has({policy}.queue) || {policy}.queue in {queues}))",
            "runPolicy.schedulingPolicy may name only the platform's priority classes and "
            f"queues ({queue_list})",
        ),
        (
            "object.kind != 'PodGroup' || ("
            f"(!has(object.spec.priorityClassName) || object.spec.priorityClassName in {classes})"
            f" && (!has(object.spec.queue) || object.spec.queue in {queues}))",
            f"a PodGroup may name only the platform's priority classes and queues ({queue_list})",
        ),
        # A bare Pod's own spec (red team pass 2, G2: the pod-template policy judges
        # templates only; a Pod takes the scheduling rules alone, since the mesh's sidecar
        # injection adds what the other pod rules refuse).
        *(
            (f"object.kind != 'Pod' || [object.spec].all(s, {check})", message)
            for check, message in scheduling_checks(allowed)
        ),
        (
            f"({_METAS}).all(t, {_meta_ok('t', queues, classes)})",
            meta_message,
        ),
        (_trainjob_metas_ok(queues, classes), meta_message),
        # The runtime's PodGroup settings are the platform's: a patch of them would be the
        # user's own gang scheduling (the backend patches pod templates only).
        (
            "object.kind != 'TrainJob' || !has(object.spec) || "
            "!has(object.spec.runtimePatches) || object.spec.runtimePatches.all(p, "
            "!has(p.trainingRuntimeSpec) || !has(p.trainingRuntimeSpec.podGroupPolicy))",
            "a TrainJob's runtimePatches may not set podGroupPolicy (the runtime's gang "
            "scheduling is the platform's)",
        ),
    ]
