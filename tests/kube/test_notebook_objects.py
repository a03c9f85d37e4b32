"""Pure builders of the notebook-controller: literal expectations, validated like the API would."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from notebook_controller import events as notebook_events
from notebook_controller import objects, slim
from notebook_controller import status as notebook_status
from notebook_controller.config import ControllerConfig
from notebook_controller.crd import notebook_crd
from notebook_controller.culling import Activity, judge_activity, should_cull
from notebook_controller.ingress import IngressAuth
from notebook_controller.manifests import RULES, all_manifests
from tests.kube.istio import SPEC_SCHEMAS, strict_json_schema
from tests.kube.istio_upstream import validate_istio_upstream
from tests.kube.validation import prune_and_default

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
OWNER_REF = {
    "apiVersion": "mlcluster.io/v1alpha1",
    "kind": "Notebook",
    "name": "nb1",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
LABELS = {
    "mlcluster.io/notebook-name": "nb1",
    "app.kubernetes.io/managed-by": "mlcluster-notebook-controller",
}
META = {"name": "nb1", "namespace": "alice", "labels": LABELS, "ownerReferences": [OWNER_REF]}


def validate_builtin(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, desired_version="1.33", strict=True)


def validate_istio(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj["spec"], strict_json_schema(SPEC_SCHEMAS[obj["kind"]]))


def notebook(**changes: Any) -> dict[str, Any]:
    nb = objects.notebook_resource(
        "nb1", "alice", "alice@example.com", cpu="2", memory="4Gi", gpus=1, workspace_size="10Gi"
    )
    nb["metadata"].update(uid="uid-1", generation=3, creationTimestamp="2026-03-01T10:00:00Z")
    for key, value in changes.items():
        nb[key] = value
    return nb


# --- the Notebook and its CRD ---------------------------------------------------------------


def test_notebook_resource() -> None:
    assert objects.notebook_resource(
        "nb1",
        "alice",
        "alice@example.com",
        image="python:3.12",
        cpu=2,
        memory="4Gi",
        gpus=1,
        workspace_size="10Gi",
        env={"A": "b"},
    ) == {
        "apiVersion": "mlcluster.io/v1alpha1",
        "kind": "Notebook",
        "metadata": {"name": "nb1", "namespace": "alice"},
        "spec": {
            "owner": "alice@example.com",
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "notebook",
                            "image": "python:3.12",
                            "resources": {
                                "requests": {"cpu": "2", "memory": "4Gi"},
                                "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"},
                            },
                            "env": [{"name": "A", "value": "b"}],
                        }
                    ]
                }
            },
            "workspace": {"size": "10Gi"},
        },
    }
    assert objects.notebook_resource("x", "ns", "bob") == {
        "apiVersion": "mlcluster.io/v1alpha1",
        "kind": "Notebook",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"owner": "bob", "template": {"spec": {"containers": [{"name": "notebook"}]}}},
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "Bad_Name"}, "lower-case"),
        ({"name": "9lives"}, "start with a letter"),
        ({"name": "x" * 53}, "at most 52"),
        ({"name": ""}, "required"),
        ({"owner": ""}, "owner"),
        ({"cpu": "lots"}, "cpu"),
        ({"memory": "4 GB"}, "memory"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"workspace_size": "big"}, "workspace size"),
    ],
)
def test_notebook_resource_rejects_bad_input(kwargs: dict[str, Any], message: str) -> None:
    args = {"name": "nb", "namespace": "ns", "owner": "me", **kwargs}
    with pytest.raises(objects.InvalidNotebook, match=message):
        objects.notebook_resource(**args)


def test_name_validator() -> None:
    assert objects.notebook_name_error("my-notebook-2") is None
    assert objects.notebook_name_error("x" * 52) is None
    for bad in ("My", "a_b", "-a", "a-", "a.b", "x" * 53):
        assert objects.notebook_name_error(bad)


def test_crd_is_valid_and_accepts_what_the_builder_makes() -> None:
    crd = notebook_crd()
    validate_builtin(crd)
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Owner",
        "Phase",
        "Ready",
        "URL",
        "Message",
        "Age",
    ]
    schema = version["schema"]["openAPIV3Schema"]
    assert "self.metadata.name.size() <= 52" in schema["x-kubernetes-validations"][0]["rule"]
    nb = notebook()
    pruned, unknown = prune_and_default(nb, schema)
    assert unknown == [] and pruned["spec"]["workspace"]["mountPath"] == "/home/jovyan"
    jsonschema.validate({"spec": nb["spec"]}, strict_json_schema(schema))
    status = notebook_status.compute_status(nb, None, None)
    jsonschema.validate({"spec": nb["spec"], "status": status}, strict_json_schema(schema))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": {"owner": "x"}}, strict_json_schema(schema))


# --- owned objects ----------------------------------------------------------------------------


def test_statefulset() -> None:
    sts = objects.statefulset(notebook(), ControllerConfig())
    assert sts == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": META,
        "spec": {
            "replicas": 1,
            "serviceName": "nb1",
            "selector": {"matchLabels": {"mlcluster.io/notebook-name": "nb1"}},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "containers": [
                        {
                            "name": "notebook",
                            "resources": {
                                "requests": {"cpu": "2", "memory": "4Gi"},
                                "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"},
                            },
                            "image": "quay.io/jupyter/scipy-notebook:latest",
                            "imagePullPolicy": "IfNotPresent",
                            "env": [
                                {"name": "NB_PREFIX", "value": "/notebook/alice/nb1"},
                                # kernel- and CLI-submitted jobs belong to the owner
                                {"name": "MLCLUSTER_USER", "value": "alice@example.com"},
                            ],
                            "command": ["jupyter", "lab"],
                            "args": [
                                "--ip=0.0.0.0",
                                "--port=8888",
                                "--no-browser",
                                "--ServerApp.base_url=$(NB_PREFIX)",
                                "--IdentityProvider.token=",
                                "--ServerApp.password=",
                                "--ServerApp.trust_xheaders=True",
                            ],
                            "ports": [
                                {"name": "notebook-port", "containerPort": 8888, "protocol": "TCP"}
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/notebook/alice/nb1/api/status", "port": 8888},
                                "periodSeconds": 5,
                                "failureThreshold": 3,
                            },
                            "volumeMounts": [
                                {"name": "workspace", "mountPath": "/home/jovyan"},
                                {"name": "dshm", "mountPath": "/dev/shm"},
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "workspace",
                            "persistentVolumeClaim": {"claimName": "nb1-workspace"},
                        },
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                    ],
                    "securityContext": {"fsGroup": 100},
                },
            },
        },
    }
    validate_builtin(sts)


def test_statefulset_keeps_the_users_template_and_stops() -> None:
    nb = notebook()
    nb["metadata"]["annotations"] = {objects.ANNOTATION_STOPPED: "2026-03-01T11:00:00Z"}
    del nb["spec"]["workspace"]
    nb["spec"]["template"] = {
        "metadata": {"labels": {"team": "vision"}, "annotations": {"a": "b"}},
        "spec": {
            "containers": [
                {
                    "name": "lab",
                    "image": "me/lab:1",
                    "command": ["start.sh"],
                    # A template claiming another owner for its jobs: the Notebook's owner wins.
                    "env": [
                        {"name": "NB_PREFIX", "value": "wrong"},
                        {"name": "X", "value": "1"},
                        {"name": "MLCLUSTER_USER", "value": "bob"},
                    ],
                },
                {"name": "sidecar", "image": "busybox:1"},
            ],
            "serviceAccountName": "runner",
            "nodeSelector": {"gpu": "a100"},
        },
    }
    sts = objects.statefulset(nb, ControllerConfig(shm_size=""))
    validate_builtin(sts)
    assert sts["spec"]["replicas"] == 0
    template = sts["spec"]["template"]
    assert template["metadata"] == {
        "labels": {"team": "vision", **LABELS},
        "annotations": {"a": "b"},
    }
    lab, sidecar = template["spec"]["containers"]
    assert lab["command"] == ["start.sh"] and "args" not in lab
    assert lab["env"] == [
        {"name": "NB_PREFIX", "value": "/notebook/alice/nb1"},
        {"name": "MLCLUSTER_USER", "value": "alice@example.com"},
        {"name": "X", "value": "1"},
    ]
    assert sidecar == {"name": "sidecar", "image": "busybox:1"}
    assert "volumes" not in template["spec"] and "volumeMounts" not in lab
    assert template["spec"]["serviceAccountName"] == "runner"
    assert template["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert (
        nb["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "wrong"
    )  # input untouched


def test_service() -> None:
    svc = objects.service(notebook(), ControllerConfig())
    assert svc == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": META,
        "spec": {
            "type": "ClusterIP",
            "selector": {"mlcluster.io/notebook-name": "nb1"},
            "ports": [{"name": "http-notebook", "port": 80, "targetPort": 8888, "protocol": "TCP"}],
        },
    }
    validate_builtin(svc)


def test_workspace_claim() -> None:
    pvc = objects.workspace_claim(notebook(), ControllerConfig(storage_class="fast"))
    assert pvc == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {**META, "name": "nb1-workspace"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
            "storageClassName": "fast",
        },
    }
    validate_builtin(pvc)


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_virtual_service(version: str) -> None:
    vs = objects.virtual_service(
        notebook(), ControllerConfig(gateway="gw/main", host="ml.example.com"), version
    )
    assert vs == {
        "apiVersion": f"networking.istio.io/{version}",
        "kind": "VirtualService",
        "metadata": META,
        "spec": {
            "hosts": ["ml.example.com"],
            "gateways": ["gw/main"],
            "http": [
                {
                    "name": "notebook",
                    "match": [
                        {"uri": {"prefix": "/notebook/alice/nb1/"}},
                        {"uri": {"exact": "/notebook/alice/nb1"}},
                    ],
                    "rewrite": {"uri": "/notebook/alice/nb1/"},
                    "route": [
                        {
                            "destination": {
                                "host": "nb1.alice.svc.cluster.local",
                                "port": {"number": 80},
                            }
                        }
                    ],
                }
            ],
        },
    }
    validate_istio(vs)


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_authorization_policy(version: str) -> None:
    config = ControllerConfig(owner_header="x-auth-user", owner_header_prefix="oidc:")
    ap = objects.authorization_policy(notebook(), config, version)
    assert ap == {
        "apiVersion": f"security.istio.io/{version}",
        "kind": "AuthorizationPolicy",
        "metadata": META,
        "spec": {
            "action": "ALLOW",
            "selector": {"matchLabels": {"mlcluster.io/notebook-name": "nb1"}},
            "rules": [
                {
                    "from": [
                        {
                            "source": {
                                "principals": [
                                    "cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"
                                ]
                            }
                        }
                    ],
                    "when": [
                        {
                            "key": "request.headers[x-auth-user]",
                            "values": ["oidc:alice@example.com"],
                        }
                    ],
                },
                {
                    "from": [
                        {
                            "source": {
                                "principals": [
                                    "cluster.local/ns/mlcluster-system/sa/notebook-controller"
                                ]
                            }
                        }
                    ],
                    "to": [
                        {
                            "operation": {
                                "methods": ["GET"],
                                "paths": [
                                    "/notebook/alice/nb1/api/status",
                                    "/notebook/alice/nb1/api/kernels",
                                    "/notebook/alice/nb1/api/terminals",
                                ],
                            }
                        }
                    ],
                },
            ],
        },
    }
    validate_istio(ap)


def test_istio_schema_check_catches_typos() -> None:
    vs = objects.virtual_service(notebook(), ControllerConfig(), "v1")
    vs["spec"]["http"][0]["rewrites"] = {"uri": "/"}
    with pytest.raises(jsonschema.ValidationError):
        validate_istio(vs)


def test_desired_children_follow_istio_and_workspace() -> None:
    config = ControllerConfig()
    both = objects.desired_children(notebook(), config, objects.IstioVersions("v1", "v1beta1"))
    assert [(c["kind"], c["apiVersion"]) for c in both] == [
        ("PersistentVolumeClaim", "v1"),
        ("Service", "v1"),
        ("StatefulSet", "apps/v1"),
        ("VirtualService", "networking.istio.io/v1"),
        ("AuthorizationPolicy", "security.istio.io/v1beta1"),
    ]
    nb = notebook()
    del nb["spec"]["workspace"]
    bare = objects.desired_children(
        nb, ControllerConfig(use_istio=False), objects.IstioVersions("v1", "v1")
    )
    assert [c["kind"] for c in bare] == ["Service", "StatefulSet"]


def test_preferred_istio_version() -> None:
    assert objects.preferred_istio_version(["v1beta1", "v1", "v1alpha3"]) == "v1"
    assert objects.preferred_istio_version(["v1alpha3", "v1beta1"]) == "v1beta1"
    assert objects.preferred_istio_version(["v1alpha3"]) is None


# --- drift --------------------------------------------------------------------------------------


def with_server_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    actual = copy.deepcopy(obj)
    actual["metadata"].update(uid="child-uid", resourceVersion="7", labels={**LABELS, "extra": "y"})
    if actual["kind"] == "StatefulSet":
        spec = actual["spec"]["template"]["spec"]
        spec.update(
            restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler"
        )
        spec["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
        spec["containers"][0]["readinessProbe"].update(timeoutSeconds=1, successThreshold=1)
        actual["spec"]["revisionHistoryLimit"] = 10
        actual["status"] = {"replicas": 1}
    if actual["kind"] == "Service":
        actual["spec"].update(clusterIP="10.96.0.12", sessionAffinity="None")
    return actual


def test_server_defaults_are_not_drift() -> None:
    config = ControllerConfig()
    for desired in objects.desired_children(notebook(), config, objects.IstioVersions("v1", "v1")):
        assert objects.repair_patch(desired, with_server_defaults(desired)) is None, desired["kind"]


def test_drift_is_repaired() -> None:
    config = ControllerConfig()
    sts = objects.statefulset(notebook(), config)
    scaled = with_server_defaults(sts)
    scaled["spec"]["replicas"] = 3
    assert objects.repair_patch(sts, scaled) == {"spec": {"replicas": 1}}
    edited = with_server_defaults(sts)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    assert objects.repair_patch(sts, edited) == {"spec": {"template": sts["spec"]["template"]}}
    ap = objects.authorization_policy(notebook(), config, "v1")
    widened = with_server_defaults(ap)
    widened["spec"]["rules"][0]["when"][0]["values"].append("mallory")
    assert objects.repair_patch(ap, widened) == {"spec": {"rules": ap["spec"]["rules"]}}
    relabelled = with_server_defaults(objects.service(notebook(), config))
    relabelled["metadata"]["labels"] = {}
    assert objects.repair_patch(objects.service(notebook(), config), relabelled) == {
        "metadata": {"labels": LABELS}
    }
    # Ownership is never patched in: the controller does not adopt (see test_attacks_cluster).


def test_what_the_indexes_keep_repairs_and_owns_as_the_whole_object() -> None:
    """The controller's indexes keep a slim copy of each object (slim.py): every judgement
    made on it (drift, ownership, status) is the one made on the whole object."""
    config = ControllerConfig()
    desired = objects.desired_children(notebook(), config, objects.IstioVersions("v1", "v1"))
    for want in desired:
        whole = with_server_defaults(want)
        whole["metadata"].update(uid="uid-child", managedFields=[{"manager": "x" * 1000}])
        kept = slim.slim_owned(whole)
        assert objects.repair_patch(want, kept) is None, want["kind"]
        assert "managedFields" not in kept["metadata"]
        assert kept["metadata"]["ownerReferences"] == [
            {k: OWNER_REF[k] for k in ("apiVersion", "kind", "name", "uid", "controller")}
        ]
        assert kept.get("status") == whole.get("status")
    sts = objects.statefulset(notebook(), config)
    edited = with_server_defaults(sts)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    edited["spec"]["replicas"] = 3
    assert objects.repair_patch(sts, slim.slim_owned(edited)) == objects.repair_patch(sts, edited)
    assert objects.repair_patch(sts, slim.slim_owned(edited)) is not None
    kept = slim.slim_owned(edited)
    assert set(kept["spec"]) == {"replicas", "template"}  # not serviceName, selector, ...
    kept["spec"]["template"]["spec"]["containers"].clear()  # a reader's copy, not the index's
    assert kept["spec"]["template"]["spec"]["containers"]
    running = {**pod("Running", READY), "spec": {"containers": [{"name": "notebook"}]}}
    assert notebook_status.compute_status(notebook(), edited, slim.slim_pod(running)) == (
        notebook_status.compute_status(notebook(), edited, running)
    )
    assert "spec" not in slim.slim_pod(running)
    # What a Notebook's objects repeat (names, labels, the owner) is kept once, not once per
    # object decoded from a watch event; a long spec field is kept compressed.
    first, second = (slim.slim_owned(json.loads(json.dumps(w))) for w in desired[:2])
    meta_a, meta_b = first["metadata"], second["metadata"]
    pairs = [(meta_a, meta_b, ("name", "namespace"))]
    pairs.append((meta_a["labels"], meta_b["labels"], tuple(meta_a["labels"])))
    owner_a, owner_b = meta_a["ownerReferences"][0], meta_b["ownerReferences"][0]
    pairs.append((owner_a, owner_b, ("apiVersion", "kind", "name", "uid")))
    for kept_a, kept_b, keys in pairs:
        same = [key for key in keys if kept_a[key] == kept_b[key]]  # (names may differ)
        assert same and all(kept_a[key] is kept_b[key] for key in same), keys
    template = json.dumps(sts["spec"]["template"], separators=(",", ":"))
    assert (
        len(slim.PackedSpec(sts["spec"], ("template",))._texts["template"]) < len(template) * 3 / 4
    )


def test_an_unchanged_spec_is_packed_once() -> None:
    """An owned object's next event with the same uid and generation (a status change, a
    relist) keeps the packed spec it had; a changed spec (its generation moves), another
    object of that name or a kind without generations is packed afresh."""
    sts = with_server_defaults(objects.statefulset(notebook(), ControllerConfig()))
    sts["metadata"].update(uid="uid-sts", generation=1)
    first = slim.slim_owned(sts)
    assert first["metadata"]["generation"] == 1
    again = copy.deepcopy(sts)
    again["status"] = {"readyReplicas": 1}
    kept = slim.slim_owned(again, first)
    assert kept["spec"] is first["spec"] and kept["status"] == {"readyReplicas": 1}
    changed = copy.deepcopy(sts)
    changed["spec"]["replicas"] = 0
    changed["metadata"]["generation"] = 2
    assert slim.slim_owned(changed, first)["spec"]["replicas"] == 0
    other = copy.deepcopy(changed)
    other["metadata"].update(uid="uid-other", generation=1)
    assert slim.slim_owned(other, first)["spec"] is not first["spec"]
    del sts["metadata"]["generation"]
    assert slim.slim_owned(sts, slim.slim_owned(sts))["spec"] == first["spec"]


def test_kopf_remembers_notebooks_only() -> None:
    """kopf's per-object memory (NotebookMemories) is kept for a Notebook from one event to
    the next; a child's or a pod's is made for each event and not kept."""
    import asyncio

    from notebook_controller.kopf_state import NotebookMemories

    memories = NotebookMemories()
    nb = {"kind": "Notebook", "metadata": {"uid": "uid-nb"}}
    children = [{"kind": k, "metadata": {"uid": f"uid-{k}"}} for k in ("StatefulSet", "Pod")]

    async def recall_twice(body: dict[str, Any]) -> bool:
        return await memories.recall(body) is await memories.recall(body)

    assert asyncio.run(recall_twice(nb))
    assert not any(asyncio.run(recall_twice(child)) for child in children)
    assert len(list(memories.iter_all_memories())) == 1


def test_kopf_diffs_notebooks_only_and_without_copying_their_status() -> None:
    """kopf builds the essence it diffs for every event of every watched kind; the
    controller's storage builds a Notebook's as kopf's own does (spec, labels, annotations
    but kopf's own), with no copy of its status, and none for a child or a pod (no change
    handler of theirs reads it)."""
    import kopf

    from notebook_controller.kopf_state import MemoryDiffBaseStorage

    nb = notebook()
    nb["metadata"].setdefault("annotations", {})["kopf.mlcluster.io/x"] = "kopf's own"
    nb["status"] = {"phase": "starting", "conditions": [{"type": "Ready", "status": "False"}]}
    reference = kopf.AnnotationsDiffBaseStorage(prefix="kopf.mlcluster.io")
    body = kopf.Body(nb)
    essence = MemoryDiffBaseStorage().build(body=body)
    assert essence == reference.build(body=body)
    assert "status" not in essence and essence["spec"] == nb["spec"]
    for kind in ("StatefulSet", "Service", "Pod"):
        child = kopf.Body({"kind": kind, "metadata": {"uid": "u"}, "spec": {}, "status": {}})
        assert MemoryDiffBaseStorage().build(body=child) is None


# --- status ------------------------------------------------------------------------------------


def pod(
    phase: str = "Pending",
    conditions: list[dict[str, Any]] | None = None,
    waiting: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if waiting:
        status["containerStatuses"] = [{"name": "notebook", "state": {"waiting": waiting}}]
    return {"metadata": {"name": "nb1-0"}, "status": status}


READY = [
    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-03-01T11:00:00Z"},
    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T11:00:05Z"},
]


def test_status_ready() -> None:
    sts = {"status": {"readyReplicas": 1}}
    assert notebook_status.compute_status(notebook(), sts, pod("Running", READY)) == {
        "phase": "ready",
        "message": "ready",
        "ready": True,
        "url": "/notebook/alice/nb1/",
        "readyReplicas": 1,
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-03-01T11:00:00Z",
            },
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-03-01T11:00:05Z"},
        ],
    }


@pytest.mark.parametrize(
    "the_pod, phase, message",
    [
        (None, "starting", "waiting for the notebook pod to be created"),
        (
            pod(
                "Pending",
                [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                    }
                ],
            ),
            "starting",
            "Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        ),
        (pod("Pending", waiting={"reason": "ContainerCreating"}), "starting", "ContainerCreating"),
        (
            pod(
                "Pending",
                waiting={
                    "reason": "ImagePullBackOff",
                    "message": 'Back-off pulling image "nope:1"',
                },
            ),
            'error: ImagePullBackOff: Back-off pulling image "nope:1"',
            'ImagePullBackOff: Back-off pulling image "nope:1"',
        ),
        (
            pod("Running", waiting={"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}),
            "error: CrashLoopBackOff: back-off 5m0s",
            "CrashLoopBackOff: back-off 5m0s",
        ),
        (
            pod("Running", [{"type": "Ready", "status": "False"}]),
            "starting",
            "waiting for JupyterLab to answer",
        ),
        (
            {
                "status": {
                    "phase": "Failed",
                    "reason": "Evicted",
                    "message": "The node was low on memory.",
                }
            },
            "error: The node was low on memory.",
            "The node was low on memory.",
        ),
    ],
)
def test_status_phases(the_pod: dict[str, Any] | None, phase: str, message: str) -> None:
    status = notebook_status.compute_status(notebook(), None, the_pod)
    assert (status["phase"], status["message"], status["ready"]) == (phase, message, False)


def test_status_stopped_and_error() -> None:
    nb = notebook()
    nb["metadata"]["annotations"] = {objects.ANNOTATION_STOPPED: "2026-03-01T11:00:00Z"}
    assert (
        notebook_status.compute_status(nb, None, None)["message"]
        == "stopped since 2026-03-01T11:00:00Z"
    )
    assert notebook_status.compute_status(nb, None, pod("Running", READY))["phase"] == "stopped"
    broken = notebook_status.compute_status(
        notebook(), None, None, error="StatefulSet nb1: quota exceeded"
    )
    assert broken["phase"] == "error: StatefulSet nb1: quota exceeded"
    assert broken["conditions"] == [{"type": "Ready", "status": "False", "reason": "Error"}]


def test_status_changed_ignores_condition_timestamps_only() -> None:
    nb = notebook(status=notebook_status.compute_status(notebook(), None, pod("Running", READY)))
    again = copy.deepcopy(nb["status"])
    again["conditions"][0]["lastTransitionTime"] = "2026-03-01T11:30:00Z"
    assert not notebook_status.status_changed(nb, again)
    assert notebook_status.status_changed(nb, {**again, "phase": "starting"})


def test_status_summary() -> None:
    nb = notebook(
        status=notebook_status.compute_status(
            notebook(), {"status": {"readyReplicas": 1}}, pod("Running", READY)
        )
    )
    nb["status"]["lastActivity"] = "2026-03-01T11:59:00Z"
    assert notebook_status.notebook_status_summary(nb) == {
        "name": "nb1",
        "namespace": "alice",
        "owner": "alice@example.com",
        "phase": "ready",
        "ready": True,
        "stopped": False,
        "url": "/notebook/alice/nb1/",
        "message": "ready",
        "created": "2026-03-01T10:00:00Z",
        "last_activity": "2026-03-01T11:59:00Z",
        "image": None,
        "cpu": "2",
        "memory": "4Gi",
        "gpus": 1,
        "workspace_size": "10Gi",
    }
    fresh = notebook_status.notebook_status_summary(notebook())
    assert (fresh["phase"], fresh["ready"], fresh["message"]) == (
        "starting",
        False,
        "waiting for the controller",
    )


def test_stop_and_start_patches() -> None:
    assert objects.stop_patch(NOW) == {
        "metadata": {"annotations": {"mlcluster.io/stopped": "2026-03-01T12:00:00Z"}}
    }
    assert objects.start_patch() == {"metadata": {"annotations": {"mlcluster.io/stopped": None}}}


# --- events -----------------------------------------------------------------------------------


def test_mirrored_event() -> None:
    source = {
        "metadata": {"uid": "ev-uid", "name": "nb1-0.17a"},
        "reason": "Pulling",
        "type": "Normal",
        "message": 'Pulling image "python:3.12"',
        "count": 2,
        "involvedObject": {"kind": "Pod", "name": "nb1-0"},
        "firstTimestamp": "2026-03-01T11:00:00Z",
        "lastTimestamp": "2026-03-01T11:00:09Z",
    }
    assert notebook_events.notebook_of_event(source) == "nb1"
    event = notebook_events.mirrored_event(notebook(), source, NOW)
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "nb1.622ba8a194fb776e", "namespace": "alice", "labels": LABELS},
        "involvedObject": {
            "apiVersion": "mlcluster.io/v1alpha1",
            "kind": "Notebook",
            "name": "nb1",
            "namespace": "alice",
            "uid": "uid-1",
        },
        "reason": "Pulling",
        "message": 'Pod nb1-0: Pulling image "python:3.12"',
        "type": "Normal",
        "count": 2,
        "firstTimestamp": "2026-03-01T11:00:00Z",
        "lastTimestamp": "2026-03-01T11:00:09Z",
        "source": {"component": "mlcluster-notebook-controller"},
        "reportingComponent": "mlcluster-notebook-controller",
        "reportingInstance": "mlcluster-notebook-controller",
    }
    validate_builtin(event)
    assert (
        notebook_events.mirrored_event(notebook(), source, NOW + datetime.timedelta(hours=1))[
            "metadata"
        ]["name"]
        == "nb1.622ba8a194fb776e"
    )
    validate_builtin(notebook_events.notebook_event(notebook(), "Culled", "idle", NOW))
    for involved, expected in [
        ({"kind": "StatefulSet", "name": "nb1"}, "nb1"),
        ({"kind": "PersistentVolumeClaim", "name": "nb1-workspace"}, "nb1"),
        ({"kind": "Pod", "name": "web-6f7d9"}, None),
        ({"kind": "Notebook", "name": "nb1"}, None),
    ]:
        assert notebook_events.notebook_of_event({"involvedObject": involved}) == expected


# --- culling ----------------------------------------------------------------------------------


def test_judge_activity_takes_the_latest_of_everything() -> None:
    activity = judge_activity(
        {
            "started": "2026-03-01T08:00:00.000000Z",
            "last_activity": "2026-03-01T10:00:00.000000Z",
            "connections": 0,
            "kernels": 1,
        },
        [
            {
                "last_activity": "2026-03-01T09:00:00.000000Z",
                "execution_state": "idle",
                "connections": 0,
            }
        ],
        [{"name": "1", "last_activity": "2026-03-01T11:00:00.000000Z"}],
    )
    assert activity == Activity(
        last_activity=datetime.datetime(2026, 3, 1, 11, tzinfo=datetime.UTC),
        busy=False,
        connections=0,
        kernels=1,
        terminals=1,
    )


@pytest.mark.parametrize(
    "busy, connections, idle_minutes, cull_connected, expected",
    [
        (False, 0, 61, False, True),
        (False, 0, 59, False, False),
        (True, 0, 600, False, False),  # a kernel is running something
        (False, 2, 600, False, False),  # a browser tab is open
        (False, 2, 600, True, True),
    ],
)
def test_should_cull(
    busy: bool, connections: int, idle_minutes: int, cull_connected: bool, expected: bool
) -> None:
    activity = Activity(NOW - datetime.timedelta(minutes=idle_minutes), busy, connections, 1, 0)
    assert should_cull(activity, NOW, 3600, cull_connected) is expected


# --- manifests --------------------------------------------------------------------------------


def _server_rbac(manifest: dict[str, Any]) -> bool:
    """One of the shared Jupyter server's RBAC objects (server_rbac.py), not the controller's."""
    from notebook_controller.server_rbac import SERVICE_ACCOUNT

    labels = manifest["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/name") == SERVICE_ACCOUNT


@pytest.mark.slow
def test_manifests_are_valid_and_least_privilege() -> None:
    manifests = all_manifests(
        namespace="ml-system",
        image="registry.example.com/mlcluster:1.0",
        ingress_auth=IngressAuth(issuer="https://dex.example.com", audiences=("mlcluster",)),
    )
    assert [m["kind"] for m in manifests] == [
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRole",  # its writes, bound in each user namespace (none here)
        "Role",
        "RoleBinding",
        "Deployment",
        "ValidatingAdmissionPolicy",  # pod templates: Notebooks; jobs in ours and Profiles'
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",  # Secrets (Opaque only), bound in ours and Profiles'
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",  # Services (no NodePort/LoadBalancer/externalIPs)
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",  # group scheduling (priority and queue, on every kind)
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",  # VirtualServices (own paths, the printed gateway only)
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",  # no mesh configuration of a user's own
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "Gateway",
        "RequestAuthentication",
        "AuthorizationPolicy",
        # The shared Jupyter server's own (test_server_rbac.py checks them)
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRole",
        "Role",
        "RoleBinding",
        # ...and the server itself, admitting only the gateway (test_attacks_cluster.py)
        "PersistentVolumeClaim",
        "PeerAuthentication",
        "AuthorizationPolicy",
        "Deployment",
        "Service",
        "VirtualService",
    ]
    for manifest in manifests:
        if manifest["kind"] == "VirtualService":  # not in the upstream excerpt
            jsonschema.validate(
                manifest["spec"], strict_json_schema(SPEC_SCHEMAS["VirtualService"])
            )
        elif "istio.io" in manifest["apiVersion"]:
            validate_istio_upstream(manifest)
        else:
            validate_builtin(manifest)
    by_kind = {m["kind"]: m for m in manifests if not _server_rbac(m)}
    container = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/mlcluster:1.0"
    assert (
        "--ControllerConfig.controller_principal=cluster.local/ns/ml-system/sa/notebook-controller"
        in container["args"]
    )
    assert by_kind["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "notebook-controller", "namespace": "ml-system"}
    ]
    verbs = {verb for rule in RULES for verb in rule["verbs"]}
    assert "delete" not in verbs and "*" not in verbs  # children go by garbage collection
    assert all(
        "*" not in rule["resources"] and "secrets" not in rule["resources"] for rule in RULES
    )
    # No issuer, or --no-gateway: no Gateway at all (never an unauthenticated one).
    for plain in (all_manifests(), all_manifests(include_gateway=False)):
        assert not {"Gateway", "RequestAuthentication"} & {m["kind"] for m in plain}


@pytest.mark.slow
def test_manifests_prepare_user_namespaces_for_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from jupyterlab_mlcluster.backends.kubernetes.rbac import ROLE_NAME
    from notebook_controller.cli import print_manifests

    assert (
        print_manifests(["--no-gateway", "--user-namespace=team-a", "--user-namespace=team-b"]) == 0
    )
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == all_manifests(include_gateway=False, user_namespaces=["team-a", "team-b"])
    printed = [m for m in printed if not _server_rbac(m)]  # test_server_rbac.py's
    extra = printed[len([m for m in all_manifests(include_gateway=False) if not _server_rbac(m)]) :]
    *extra, reader_role, reader_binding = extra
    assert (reader_role["kind"], reader_binding["kind"]) == ("ClusterRole", "ClusterRoleBinding")
    assert reader_role["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["clustertrainingruntimes"],
            "verbs": ["get", "list"],
        }
    ]
    assert reader_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mlcluster-notebook", "namespace": ns}
        for ns in ("team-a", "team-b")
    ]
    assert [(m["kind"], m["metadata"].get("namespace", m["metadata"]["name"])) for m in extra] == [
        (kind, namespace)
        for namespace in ("team-a", "team-b")
        for kind in (
            "Namespace",
            "PeerAuthentication",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ResourceQuota",  # no pods of the system PriorityClasses (issue 31)
            "RoleBinding",  # the controller's writes there
        )
    ]
    for manifest in extra:
        if "istio.io" in manifest["apiVersion"]:
            validate_istio_upstream(manifest)
        else:
            validate_builtin(manifest)
    extra = [m for m in extra if m["kind"] not in ("Namespace", "PeerAuthentication")]
    binding = extra[2]
    assert binding["roleRef"]["name"] == ROLE_NAME
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mlcluster-notebook", "namespace": "team-a"}
    ]
    # The controller runs notebook pods as that account (when their template names none).
    deployment = next(m for m in printed if m["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--ControllerConfig.service_account=mlcluster-notebook" in args
    # A name that cannot be a namespace is refused, and nothing is printed to apply.
    for bad in (
        ["--user-namespace=Team_A"],
        ["--namespace=ml_system"],
        ["--user-namespace=" + "a" * 64],
    ):
        assert print_manifests(bad) != 0
        captured = capsys.readouterr()
        assert captured.out == "" and "namespaces are at most 63" in captured.err
    # Without user namespaces, nothing of the kind: notebook pods keep the namespace default.
    plain = all_manifests(include_gateway=False)
    assert not any(m["kind"] == "Role" and m["metadata"]["name"] == ROLE_NAME for m in plain)
    assert not any(
        "service_account" in a
        for a in next(m for m in plain if m["kind"] == "Deployment")["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
    )
