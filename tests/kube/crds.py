"""CustomResourceDefinitions for the emulator: the Training Operator's, Volcano's, and the
metrics API's kinds, so the Kubernetes backend meets them as on a real cluster.

Where the schemas come from:
- PyTorchJob, TFJob (kubeflow.org/v1): derived at test time from the Training Operator's own
  Python SDK models (`kubeflow-training`, via `tests/k8s_schemas.training_operator_schema`),
  with every Kubernetes type they embed (the pod template) inlined from the official
  schemas kubernetes-validate ships; then turned into a structural OpenAPI v3 schema as
  controller-gen writes for CRDs: `nullable` instead of null types, int-or-string for
  quantities and ports, and embedded ObjectMeta reduced to the fields controller-gen keeps
  (`crd:generateEmbeddedObjectMeta=true`: labels, annotations, name, namespace, finalizers).
- PodGroup (scheduling.volcano.sh/v1beta1): the hand-written schema in tests/k8s_schemas.py
  (from Volcano's API types), converted the same way.
- PodMetrics (metrics.k8s.io/v1beta1): the metrics API is an aggregated API, not a CRD; a CRD
  with the same group, plural and shape serves the same paths. Schema written by hand from
  k8s.io/metrics/pkg/apis/metrics/v1beta1/types.go (PodMetrics: timestamp, window,
  containers[].name/usage).
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
from typing import Any

from tests.k8s_schemas import PODGROUP_SCHEMA, training_operator_schema

_K8S_PREFIX = "https://kubernetes.io/api/_definitions.json#/$defs/"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_EMBEDDED_META = {
    "type": "object",
    "properties": {
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "name": {"type": "string"},
        "namespace": {"type": "string"},
    },
}
# Kinds whose values are a number or a string in JSON.
_INT_OR_STRING = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
}


@functools.cache
def _k8s_definitions() -> dict[str, Any]:
    root = importlib.resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema/v1.33.0-local-strict"
    )
    return json.loads(root.joinpath("_definitions.json").read_text())["$defs"]


def structural(
    schema: dict[str, Any], local_defs: dict[str, Any], seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A JSON Schema (2020-12, with $refs) as a structural OpenAPI v3 CRD schema.

    `local_defs`: what `#/$defs/...` means where `schema` sits (the SDK-derived schema's own
    definitions, or Kubernetes' once inside one of its types)."""
    ref = schema.get("$ref")
    if ref is not None:
        return _referenced(ref, local_defs, seen)
    result = _typed(schema)
    if "oneOf" in schema:  # what the Kubernetes schemas use for int-or-string
        return {"x-kubernetes-int-or-string": True}
    for key in ("format", "enum", "required", "minimum", "maximum"):
        if key in schema and key not in result:
            result[key] = copy.deepcopy(schema[key])
    if "properties" in schema:
        result["type"] = "object"
        result["properties"] = {
            k: structural(v, local_defs, seen) for k, v in schema["properties"].items()
        }
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        result["type"] = "object"
        result["additionalProperties"] = structural(additional, local_defs, seen)
    if "items" in schema:
        result["items"] = structural(schema["items"], local_defs, seen)
    if "type" not in result:  # any JSON value (the SDK's "object")
        return {"x-kubernetes-preserve-unknown-fields": True}
    if (
        result["type"] == "object"
        and "properties" not in result
        and "additionalProperties" not in result
    ):
        result["x-kubernetes-preserve-unknown-fields"] = True
    return result


def _referenced(ref: str, local_defs: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
    """What a `$ref` names, converted; Kubernetes' own kinds as controller-gen writes them."""
    name = ref.rpartition("/")[2]
    if ref.startswith(_K8S_PREFIX) or local_defs is _k8s_definitions():
        if name in _INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        if name == _OBJECT_META:
            return copy.deepcopy(_EMBEDDED_META)
        local_defs = _k8s_definitions()
    if name in seen:
        raise ValueError(f"recursive schema through {name}: a CRD schema cannot express it")
    return structural(local_defs[name], local_defs, (*seen, name))


def _typed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema's type in OpenAPI v3: one type, `nullable` for JSON Schema's null, and a
    `const` as a one-value enum."""
    result: dict[str, Any] = {}
    types = schema.get("type")
    if isinstance(types, list):
        real = [t for t in types if t != "null"]
        if len(real) == 1:
            result["type"] = real[0]
        if "null" in types:
            result["nullable"] = True
    elif types is not None:
        result["type"] = types
    if "const" in schema:
        result.setdefault("type", "string")
        result["enum"] = [schema["const"]]
    return result


def _root_schema(json_schema: dict[str, Any]) -> dict[str, Any]:
    schema = structural(json_schema, json_schema.get("$defs", {}))
    # The API server validates metadata as ObjectMeta whatever the CRD says (controller-gen
    # writes `type: object`); left out here because the emulator would prune inside it.
    schema["properties"].pop("metadata", None)
    for key in ("apiVersion", "kind"):
        schema["properties"][key] = {"type": "string"}
    schema.pop("required", None)  # the API server requires apiVersion/kind/metadata itself
    return schema


def crd(
    group: str,
    version: str,
    kind: str,
    plural: str,
    schema: dict[str, Any],
    *,
    status: bool = True,
    short_names: tuple[str, ...] = (),
) -> dict[str, Any]:
    names: dict[str, Any] = {
        "plural": plural,
        "singular": kind.lower(),
        "kind": kind,
        "listKind": f"{kind}List",
    }
    if short_names:
        names["shortNames"] = list(short_names)
    version_doc: dict[str, Any] = {
        "name": version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
    }
    if status:
        version_doc["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": names, "versions": [version_doc]},
    }


@functools.cache
def _training_operator_crds() -> tuple[dict[str, Any], ...]:
    return tuple(
        crd("kubeflow.org", "v1", kind, plural, _root_schema(training_operator_schema(kind)))
        for kind, plural in (("PyTorchJob", "pytorchjobs"), ("TFJob", "tfjobs"))
    )


def training_operator_crds() -> list[dict[str, Any]]:
    """PyTorchJob and TFJob CRDs (kubeflow.org/v1), status subresource included."""
    return copy.deepcopy(list(_training_operator_crds()))


def podgroup_crd() -> dict[str, Any]:
    schema = copy.deepcopy(PODGROUP_SCHEMA)
    schema["properties"]["status"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    return crd(
        "scheduling.volcano.sh",
        "v1beta1",
        "PodGroup",
        "podgroups",
        _root_schema(schema),
        short_names=("pg",),
    )


_RESOURCE_LIST = {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}}


def pod_metrics_crd() -> dict[str, Any]:
    """metrics.k8s.io/v1beta1 PodMetrics, served as `pods` like metrics-server serves it."""
    schema = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "timestamp": {"type": "string", "format": "date-time"},
            "window": {"type": "string"},
            "containers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "usage"],
                    "properties": {"name": {"type": "string"}, "usage": _RESOURCE_LIST},
                },
            },
        },
    }
    return crd("metrics.k8s.io", "v1beta1", "PodMetrics", "pods", schema, status=False)


# --- Kubeflow Trainer v2: the published CRDs and runtimes, as fetched (tests/kube/upstream) ---

UPSTREAM = importlib.resources.files("tests.kube").joinpath("upstream")


@functools.cache
def _trainer_file(name: str) -> dict[str, Any]:
    import yaml

    # libyaml's loader where PyYAML has it: the 550 KB Trainer CRD takes 1.5 s in pure Python.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(UPSTREAM.joinpath("kubeflow-trainer", name).read_text(), Loader=loader)


def trainer_crds() -> list[dict[str, Any]]:
    """TrainJob, TrainingRuntime and ClusterTrainingRuntime (trainer.kubeflow.org), v2.3.0."""
    return [
        copy.deepcopy(_trainer_file(f"trainer.kubeflow.org_{plural}.yaml"))
        for plural in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
    ]


def trainer_runtime(name: str = "torch-distributed") -> dict[str, Any]:
    """One of the Trainer's own ClusterTrainingRuntimes (torch-distributed, jax-distributed)."""
    files = {
        "torch-distributed": "torch_distributed.yaml",
        "jax-distributed": "jax_distributed.yaml",
    }
    return copy.deepcopy(_trainer_file(files[name]))


def trainer_schema(kind: str = "TrainJob") -> dict[str, Any]:
    """The published openAPIV3Schema of a Trainer kind, made strict for tests: an object
    with declared properties admits no others (a real server prunes them: a field we set
    that the Trainer does not know would silently vanish)."""
    plural = {"TrainJob": "trainjobs", "ClusterTrainingRuntime": "clustertrainingruntimes"}[kind]
    crd = _trainer_file(f"trainer.kubeflow.org_{plural}.yaml")
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _strict(value)
    elif isinstance(schema, list):
        for item in schema:
            _strict(item)
    return schema
