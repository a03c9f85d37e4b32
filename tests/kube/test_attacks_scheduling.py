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

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from notebook_controller.admission import admission_policy
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
