"""Issue 31, 4: what a user's pod template may ask of the scheduler, played as attacks.

Mallory's job or notebook template names `system-node-critical` (preempting other tenants),
places her pods by affinity next to a chosen victim's in another namespace, or picks her own
scheduler or runtime class (around the gang scheduler and its queues). The shipped
ValidatingAdmissionPolicy's own CEL, evaluated with a CEL interpreter, denies each; what the
platform allows (`mlcluster manifests --priority-class/--scheduler-name/--allowed-runtime-class`)
and same-namespace affinity pass. Each user namespace is printed with a ResourceQuota that lets
no pod of the system classes exist there, valid against the Kubernetes schemas.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from notebook_controller.admission import admission_objects, admission_policy
from notebook_controller.cli import print_manifests
from notebook_controller.manifests import all_manifests
from notebook_controller.scheduling_policy import (
    SYSTEM_PRIORITY_CLASSES,
    SchedulingAllowList,
)
from tests.kube.admission_cel import denials
from tests.kube.test_attacks_cluster import (
    JOB_KINDS,
    MORE_KINDS,
    POLICY,
    SERVICE_ACCOUNTS,
    _job,
    _notebook,
    _pod_specs,
    _validate_shape,
)
from tests.kube.validation import validate_builtin_uncached

VICTIM = {"matchLabels": {"app": "alice-training"}}


def _affinity(kind: str, how: str, term_extra: dict[str, Any]) -> Callable[[dict], None]:
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": VICTIM, **term_extra}
    if how == "required":
        rule: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    else:
        rule = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": term}
            ]
        }
    return lambda s: s.update(affinity={kind: rule})


SCHEDULING_ESCAPES: dict[str, Callable[[dict], None]] = {
    **{
        f"priorityClassName {name}": (lambda n: lambda s: s.update(priorityClassName=n))(name)
        for name in SYSTEM_PRIORITY_CLASSES
    },
    "priorityClassName not in the allow-list": lambda s: s.update(priorityClassName="urgent"),
    "schedulerName of one's own": lambda s: s.update(schedulerName="my-scheduler"),
    "schedulerName default-scheduler where volcano is the platform's": lambda s: s.update(
        schedulerName="default-scheduler"
    ),
    "runtimeClassName": lambda s: s.update(runtimeClassName="unvetted"),
    **{
        f"{kind} {how} term with {what}": _affinity(kind, how, extra)
        for kind in ("podAffinity", "podAntiAffinity")
        for how in ("required", "preferred")
        for what, extra in {
            "namespaces": {"namespaces": ["alice"]},
            "a namespaceSelector": {"namespaceSelector": {"matchLabels": {"team": "alice"}}},
            "an empty namespaceSelector (every namespace)": {"namespaceSelector": {}},
        }.items()
    },
}
# The platform's choices in these tests: Volcano, its two job classes, gVisor.
PLATFORM = SchedulingAllowList(
    priority_classes=("training-high", "training-low"),
    scheduler="volcano",
    runtime_classes=("gvisor",),
)
PLATFORM_POLICY = admission_policy(SERVICE_ACCOUNTS, scheduling=PLATFORM)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Notebook", *JOB_KINDS, *MORE_KINDS])
@pytest.mark.parametrize("escape", sorted(SCHEDULING_ESCAPES))
def test_attack_pod_templates_preempt_place_by_victim_or_pick_their_scheduler(
    kind: str, escape: str
) -> None:
    obj = _notebook() if kind == "Notebook" else _job(kind)
    SCHEDULING_ESCAPES[escape](_pod_specs(obj)[-1])
    _validate_shape(obj)
    assert denials(PLATFORM_POLICY, obj), f"{kind} with {escape} was admitted"
    if "volcano" not in escape:  # the default allow-lists refuse each too
        assert denials(POLICY, obj), f"{kind} with {escape} was admitted by default"


def test_what_the_platform_allows_and_same_namespace_affinity_are_admitted() -> None:
    obj = _job("Job")
    spec = _pod_specs(obj)[0]
    spec.update(
        priorityClassName="training-high", schedulerName="volcano", runtimeClassName="gvisor"
    )
    spec["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": VICTIM}
            ]
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": VICTIM,
                        "namespaces": [],
                    },
                }
            ]
        },
    }
    _validate_shape(obj)
    assert denials(PLATFORM_POLICY, obj) == []
    # The default lists: no chosen class, the default scheduler.
    assert len(denials(POLICY, obj)) == 3
    bare = _job("Job")
    _pod_specs(bare)[0]["schedulerName"] = "default-scheduler"
    assert denials(POLICY, bare) == []


def test_a_system_class_or_a_name_that_breaks_the_cel_is_no_allow_list_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for bad in (
        {"priority_classes": ("system-node-critical",)},
        {"scheduler": "x' || true || '"},
        {"runtime_classes": ("A B",)},
    ):
        with pytest.raises(ValueError):
            SchedulingAllowList(**bad)  # type: ignore[arg-type]
    assert print_manifests(["--no-gateway", "--priority-class", "10=system-cluster-critical"])
    captured = capsys.readouterr()
    assert captured.out == "" and "preempts every tenant" in captured.err


@pytest.mark.slow
def test_the_scheduling_allow_lists_come_from_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same mapping as MLClusterConfig.kubernetes_priority_classes, the scheduler and the
    runtime classes reach the printed policy."""
    argv = [
        "--no-gateway",
        "--priority-class=10=training-high",
        "--priority-class=-10=training-low",
        "--scheduler-name=volcano",
        "--allowed-runtime-class=gvisor",
    ]
    assert print_manifests(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    [policy] = [
        d
        for d in printed
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == POLICY["metadata"]["name"]
    ]
    assert policy == PLATFORM_POLICY


def test_each_user_namespace_admits_no_pod_of_the_system_classes() -> None:
    """Pods the policy does not judge (bare Pods, a class given by default) still cannot be
    of a system class in a user namespace: a ResourceQuota scoped to those classes, 0 pods,
    valid against the Kubernetes 1.33 schema."""
    printed = all_manifests(user_namespaces=["alice", "bob"])
    quotas = {m["metadata"]["namespace"]: m for m in printed if m["kind"] == "ResourceQuota"}
    assert sorted(quotas) == ["alice", "bob"]
    for quota in quotas.values():
        assert validate_builtin_uncached(quota) == []
        assert quota["spec"]["hard"] == {"pods": "0"}
        [scope] = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert scope["scopeName"] == "PriorityClass" and scope["operator"] == "In"
        assert sorted(scope["values"]) == ["system-cluster-critical", "system-node-critical"]


# --- the group level (red team of issue 31, F3) ---------------------------------------------


def _group_policy(scheduling: SchedulingAllowList) -> dict[str, Any]:
    [policy] = [
        m
        for m in admission_objects(SERVICE_ACCOUNTS, scheduling=scheduling)
        if m["kind"] == "ValidatingAdmissionPolicy"
        and m["metadata"]["name"] == "mlcluster-group-scheduling"
    ]
    return policy


VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
PLATFORM_QUEUES = SchedulingAllowList(
    priority_classes=("training-high", "training-low"),
    scheduler="volcano",
    queues=("team-b",),
)


def _run_policy(obj: dict[str, Any], **fields: str) -> dict[str, Any]:
    obj["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 2, **fields}}
    return obj


def _podgroup(**spec: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "mallory"},
        "spec": {"minMember": 1, **spec},
    }


def _template_meta(kind: str, **meta: dict[str, str]) -> dict[str, Any]:
    obj = _job(kind)
    if kind in ("PyTorchJob", "TFJob"):
        templates = [r["template"] for r in next(iter(obj["spec"].values())).values()]
    elif kind == "CronJob":
        templates = [obj["spec"]["jobTemplate"]["spec"]["template"]]
    else:
        templates = [obj["spec"]["template"]]
    templates[-1]["metadata"] = meta
    return obj


GROUP_ESCAPES: dict[str, Callable[[], dict[str, Any]]] = {
    **{
        f"{kind} runPolicy.schedulingPolicy.priorityClass system-node-critical": (
            lambda k: lambda: _run_policy(_job(k), priorityClass="system-node-critical")
        )(kind)
        for kind in ("PyTorchJob", "TFJob")
    },
    "PyTorchJob runPolicy.schedulingPolicy.queue of another team": lambda: _run_policy(
        _job("PyTorchJob"), queue="team-a"
    ),
    "PodGroup priorityClassName system-cluster-critical": lambda: _podgroup(
        priorityClassName="system-cluster-critical"
    ),
    "PodGroup priorityClassName not in the allow-list": lambda: _podgroup(
        priorityClassName="urgent"
    ),
    "PodGroup queue of another team": lambda: _podgroup(queue="team-a"),
    **{
        f"{kind} pod template annotation {VOLCANO_QUEUE}": (
            lambda k: lambda: _template_meta(k, annotations={VOLCANO_QUEUE: "team-a"})
        )(kind)
        for kind in ("Job", "CronJob", "PyTorchJob")
    },
    **{
        f"{kind} pod template label {KUEUE_PRIORITY}": (
            lambda k: lambda: _template_meta(k, labels={KUEUE_PRIORITY: "top-priority"})
        )(kind)
        for kind in ("Job", "TFJob")
    },
    "Job's own annotation of another team's queue": lambda: {
        **_job("Job"),
        "metadata": {
            "name": "j",
            "namespace": "mallory",
            "annotations": {VOLCANO_QUEUE: "team-a"},
        },
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("escape", sorted(GROUP_ESCAPES))
def test_attack_group_level_priority_and_queue_fields_take_the_same_allow_lists(
    escape: str,
) -> None:
    """Red team of issue 31, F3: the pod-spec check judged `priorityClassName` only, while
    Volcano orders and preempts by the PodGroup's priority and queue, which a PyTorchJob's
    `runPolicy.schedulingPolicy`, a PodGroup of the notebook account's own (it may create
    them: the backend makes its jobs' PodGroups), the queue annotation on a pod template or
    Kueue's priority label set. Each names only what the platform allows, with the default
    lists and with the platform's; the pods themselves named no class, so neither the
    pod-spec policy nor the system-priority quota saw them."""
    for scheduling in (PLATFORM_QUEUES, SchedulingAllowList()):
        obj = GROUP_ESCAPES[escape]()
        printed = [
            m
            for m in admission_objects(SERVICE_ACCOUNTS, scheduling=scheduling)
            if m["kind"] == "ValidatingAdmissionPolicy"
        ]
        assert any(denials(p, obj) for p in printed), f"{escape} was admitted"


@pytest.mark.slow
def test_the_platforms_own_group_fields_are_admitted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What the backend makes for a job with the platform's class and queue (its PodGroup,
    a PyTorchJob's runPolicy), Volcano's default queue, Kueue's LocalQueue label (a queue
    of the job's own namespace) and the group annotation pass."""
    from jupyterlab_mlcluster.backends.kubernetes.objects import pod_group

    policy = _group_policy(PLATFORM_QUEUES)
    for queue in ("team-b", "default", None):
        made = pod_group(
            "j",
            "mallory",
            {},
            pods=2,
            min_resources={"cpu": "2"},
            queue=queue,
            priority_class="training-high",
        )
        assert denials(policy, made) == [], queue
        run = _run_policy(_job("PyTorchJob"), priorityClass="training-low")
        if queue:
            run["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = queue
        assert denials(policy, run) == [], queue
    ok = _template_meta(
        "Job",
        annotations={VOLCANO_QUEUE: "team-b", "scheduling.k8s.io/group-name": "j"},
        labels={KUEUE_PRIORITY: "training-high", "kueue.x-k8s.io/queue-name": "user-queue"},
    )
    assert denials(policy, ok) == []
    assert validate_builtin_uncached(policy) == []
    # The queue allow-list comes from the command line (none: Volcano's `default` only).
    assert denials(_group_policy(SchedulingAllowList()), _podgroup(queue="team-b"))
    assert print_manifests(["--no-gateway", "--allowed-queue=team-b"]) == 0
    [printed] = [
        d
        for d in yaml.safe_load_all(capsys.readouterr().out)
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == "mlcluster-group-scheduling"
    ]
    assert denials(printed, _podgroup(queue="team-b")) == []
    assert denials(printed, _podgroup(queue="team-a"))
    with pytest.raises(ValueError):
        SchedulingAllowList(queues=("x' || true || '",))


# --- a TrainJob's metadata below the top level (red team pass 2, G3) -------------------------


def _trainjob(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t", "namespace": "mallory"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }


def _runtime_patch(runtime_spec: dict[str, Any]) -> dict[str, Any]:
    return {"runtimePatches": [{"manager": "mallory", "trainingRuntimeSpec": runtime_spec}]}


def _replicated(template: dict[str, Any]) -> dict[str, Any]:
    return _runtime_patch(
        {"template": {"spec": {"replicatedJobs": [{"name": "node", **template}]}}}
    )


# Where a TrainJob carries labels and annotations on to the JobSet, its Jobs or its pods.
TRAINJOB_METAS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "spec.labels and spec.annotations (Trainer v2.0)": lambda meta: dict(meta),
    "podTemplateOverrides[].metadata (Trainer v2.1)": lambda meta: {
        "podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "metadata": meta}]
    },
    "runtimePatches: the JobSet template's metadata": lambda meta: _runtime_patch(
        {"template": {"metadata": meta}}
    ),
    "runtimePatches: a replicated job's metadata": lambda meta: _replicated(
        {"template": {"metadata": meta}}
    ),
    "runtimePatches: a pod template's metadata (the backend's own patch)": lambda meta: _replicated(
        {"template": {"spec": {"template": {"metadata": meta}}}}
    ),
}
# Each key alone, with values neither allow-list has.
FOREIGN_METAS = {
    "another team's queue": {"annotations": {VOLCANO_QUEUE: "team-a"}},
    "a Kueue priority outside the list": {"labels": {KUEUE_PRIORITY: "top-priority"}},
    "Kueue's priority system-node-critical": {"labels": {KUEUE_PRIORITY: "system-node-critical"}},
}
META_MESSAGE = f"{VOLCANO_QUEUE} may name only the platform's queues"


@pytest.mark.slow
@pytest.mark.parametrize("where", sorted(TRAINJOB_METAS))
def test_attack_trainjob_queue_and_priority_below_the_top_level(where: str) -> None:
    """Red team pass 2, G3: the group policy judged a TrainJob's own metadata only, while
    the Trainer carries the labels and annotations of `spec` (v2.0), of its pod overrides
    (v2.1) and of each runtime patch's JobSet, replicated job and pod template (v2.3) on to
    the objects Volcano and Kueue read. Each is judged with the same lists now, with the
    platform's and with the defaults; the same place naming what the platform allows passes
    (so the refusal is the rule's, not an error of the expression on that shape)."""
    for what, meta in FOREIGN_METAS.items():
        for scheduling in (PLATFORM_QUEUES, SchedulingAllowList()):
            attack = _trainjob(TRAINJOB_METAS[where](copy.deepcopy(meta)))
            refused = denials(_group_policy(scheduling), attack)
            assert any(META_MESSAGE in d for d in refused), f"{where}: {what} was admitted"
    allowed = {
        "annotations": {VOLCANO_QUEUE: "team-b", "scheduling.k8s.io/group-name": "t"},
        "labels": {KUEUE_PRIORITY: "training-high", "kueue.x-k8s.io/queue-name": "user-queue"},
    }
    printed = [
        m
        for m in admission_objects(SERVICE_ACCOUNTS, scheduling=PLATFORM_QUEUES)
        if m["kind"] == "ValidatingAdmissionPolicy"
    ]
    obj = _trainjob(TRAINJOB_METAS[where](allowed))
    assert [d for p in printed for d in denials(p, obj)] == []


@pytest.mark.parametrize(
    "group_policy",
    [
        {"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 1}}},
        {"coscheduling": {"scheduleTimeoutSeconds": 1}},
    ],
    ids=["volcano", "coscheduling"],
)
def test_attack_trainjob_runtime_patch_of_the_pod_group_policy(
    group_policy: dict[str, Any],
) -> None:
    """Red team pass 2, G3: a runtime patch of `podGroupPolicy` would make the user's own
    gang settings out of the runtime's (the backend patches pod templates only)."""
    attack = _trainjob(_runtime_patch({"podGroupPolicy": group_policy}))
    for scheduling in (PLATFORM_QUEUES, SchedulingAllowList()):
        refused = denials(_group_policy(scheduling), attack)
        assert any("podGroupPolicy" in d for d in refused), refused


@pytest.mark.parametrize(
    ("gang", "queue"), [("volcano", "team-b"), ("volcano", "default"), ("kueue", "user-queue")]
)
def test_the_backends_own_trainjob_with_a_queue_is_admitted(gang: str, queue: str) -> None:
    """What the builder submits for a TrainJob in a queue (the queue on the TrainJob, the
    group annotation and the job's labels in its pod patch) passes every printed policy;
    the same object with another team's queue in its pod patch does not."""
    from jupyterlab_mlcluster.backends.kubernetes.objects import build_job_objects
    from jupyterlab_mlcluster.jobs.model import JobSpec

    built = build_job_objects(
        "j3fa9c21b0",
        JobSpec.from_options({"workers": 2, "framework": "pytorch"}, default_backend="kubernetes"),
        namespace="mallory",
        image="python:3.11",
        user="mallory@example.com",
        payload_chunks=[b"x"],
        engine="trainjob",
        gang=gang,
        queue=queue,
        service_account=SERVICE_ACCOUNTS[0],
        report_key=b"k" * 32,
        runtime="torch-distributed",
    )
    job = built.job
    [patch] = job["spec"]["runtimePatches"]
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod_meta = node["template"]["spec"]["template"]["metadata"]
    assert pod_meta["labels"]  # the path the attack above uses is the one the backend writes
    printed = [
        m
        for m in admission_objects(SERVICE_ACCOUNTS, scheduling=PLATFORM_QUEUES)
        if m["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert [d for p in printed for d in denials(p, job)] == []
    pod_meta.setdefault("annotations", {})[VOLCANO_QUEUE] = "team-a"
    assert any(META_MESSAGE in d for d in denials(_group_policy(PLATFORM_QUEUES), job))


# --- kinds the first pass did not judge (red team pass 2, G2) --------------------------------

OTHER_KUBEFLOW = {
    "MPIJob": "mpiReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
}
POD = {"containers": [{"name": "c", "image": "python:3.11"}]}


def _kubeflow(kind: str, pod: dict[str, Any], meta: dict[str, Any] | None = None) -> dict:
    template: dict[str, Any] = {"spec": pod}
    if meta:
        template["metadata"] = meta
    return {
        "apiVersion": "kubeflow.org/v2beta1" if kind == "MPIJob" else "kubeflow.org/v1",
        "kind": kind,
        "metadata": {"name": "j", "namespace": "mallory"},
        "spec": {OTHER_KUBEFLOW[kind]: {"Worker": {"replicas": 2, "template": template}}},
    }


def _apps(kind: str, pod: dict[str, Any], meta: dict[str, Any] | None = None) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "d", "namespace": "mallory"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}, **(meta or {})}, "spec": pod},
        },
    }


def _pod(pod: dict[str, Any], meta: dict[str, Any] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "mallory", **(meta or {})},
        "spec": pod,
    }


SYSTEM_POD = {**POD, "priorityClassName": "system-node-critical"}
OTHER_SCHEDULER = {**POD, "schedulerName": "my-scheduler"}
QUEUE_META = {"annotations": {VOLCANO_QUEUE: "team-a"}}
UNCOVERED: dict[str, Callable[[], dict[str, Any]]] = {
    **{
        f"{kind} runPolicy.schedulingPolicy.priorityClass system-node-critical": (
            lambda k: lambda: _run_policy(_kubeflow(k, POD), priorityClass="system-node-critical")
        )(kind)
        for kind in OTHER_KUBEFLOW
    },
    **{
        f"{kind} runPolicy.schedulingPolicy.queue of another team": (
            lambda k: lambda: _run_policy(_kubeflow(k, POD), queue="team-a")
        )(kind)
        for kind in OTHER_KUBEFLOW
    },
    **{
        f"{kind} pod template priorityClassName system-node-critical": (
            lambda k: lambda: _kubeflow(k, SYSTEM_POD)
        )(kind)
        for kind in OTHER_KUBEFLOW
    },
    "MPIJob pod template queue annotation": lambda: _kubeflow("MPIJob", POD, QUEUE_META),
    **{
        f"{kind} pod template priorityClassName system-node-critical": (
            lambda k: lambda: _apps(k, SYSTEM_POD)
        )(kind)
        for kind in ("Deployment", "ReplicaSet", "DaemonSet")
    },
    "Deployment pod template schedulerName of its own": lambda: _apps(
        "Deployment", OTHER_SCHEDULER
    ),
    "DaemonSet pod template queue annotation": lambda: _apps("DaemonSet", POD, QUEUE_META),
    "bare Pod priorityClassName system-node-critical": lambda: _pod(SYSTEM_POD),
    "bare Pod schedulerName of its own": lambda: _pod(OTHER_SCHEDULER),
    "bare Pod queue annotation of another team": lambda: _pod(POD, QUEUE_META),
}


@pytest.mark.slow
@pytest.mark.parametrize("escape", sorted(UNCOVERED))
def test_attack_other_kubeflow_jobs_bare_pods_and_workloads_take_the_same_lists(
    escape: str,
) -> None:
    """Red team pass 2, G2: kubeflow-edit also creates MPIJobs, XGBoostJobs, PaddleJobs,
    JAXJobs (the same runPolicy.schedulingPolicy), bare Pods, Deployments, ReplicaSets and
    DaemonSets, which neither the pod-template nor the group policy judged: a system class,
    another team's queue or a scheduler of one's own went through. Each is refused now; the
    same objects naming what the platform allows pass."""
    for scheduling in (PLATFORM_QUEUES, SchedulingAllowList()):
        printed = [
            m
            for m in admission_objects(SERVICE_ACCOUNTS, scheduling=scheduling)
            if m["kind"] == "ValidatingAdmissionPolicy"
        ]
        obj = UNCOVERED[escape]()
        assert any(denials(p, obj) for p in printed), f"{escape} was admitted"


@pytest.mark.slow
def test_the_newly_judged_kinds_admit_what_the_platform_allows() -> None:
    printed = [
        m
        for m in admission_objects(SERVICE_ACCOUNTS, scheduling=PLATFORM_QUEUES)
        if m["kind"] == "ValidatingAdmissionPolicy"
    ]
    pod = {**POD, "priorityClassName": "training-high", "schedulerName": "volcano"}
    meta = {"annotations": {VOLCANO_QUEUE: "team-b"}}
    allowed = [
        *(_run_policy(_kubeflow(k, pod, meta), queue="team-b") for k in OTHER_KUBEFLOW),
        *(_apps(k, pod, meta) for k in ("Deployment", "ReplicaSet", "DaemonSet")),
        _pod(pod, meta),
        # What sidecar injection adds to a pod (root, NET_ADMIN) is not the Pod rule's matter.
        _pod(
            {
                **pod,
                "initContainers": [
                    {
                        "name": "istio-init",
                        "image": "istio/proxyv2",
                        "securityContext": {
                            "runAsUser": 0,
                            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
                        },
                    }
                ],
            }
        ),
    ]
    for obj in allowed:
        assert [d for p in printed for d in denials(p, obj)] == [], obj["kind"]
