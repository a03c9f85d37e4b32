"""Validation of the manifests mlcluster builds, against real schemas, for tests.

- Built-in kinds: `kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)`.
- PyTorchJob and TFJob (kubeflow.org/v1): JSON schemas derived at test time from the
  Training Operator's own Python SDK (`kubeflow-training`, a test dependency): its
  OpenAPI-generated model classes list every field with its type and JSON name, and their
  setters say which fields are required. The model files are read, not imported (importing
  them imports every model of the `kubernetes` client too: seconds). The Kubernetes types
  embedded in them (ObjectMeta, PodTemplateSpec, ...) point at the official schemas that
  kubernetes-validate ships, so pod templates inside custom resources are checked as
  strictly as built-in kinds.
- PodGroup (scheduling.volcano.sh/v1beta1): no Python package publishes it, so the schema
  below is written by hand from Volcano's API reference (the Go types `PodGroup`,
  `PodGroupSpec` in volcano-sh/apis, pkg/apis/scheduling/v1beta1/types.go; int32 fields
  as in its CRD).

Unknown fields are rejected: the API server drops them from structural CRDs without a word
(or rejects them with fieldValidation=Strict), so a misspelt field would be silently lost.
"""

from __future__ import annotations

import ast
import functools
import importlib.resources
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

K8S_VERSION = "1.33"
_SCHEMA_DIR = f"kubernetes-json-schema/v{K8S_VERSION}.0-local-strict"
_K8S_DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
# SDK type name -> Kubernetes OpenAPI definition.
_K8S_TYPES = {
    "V1ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    "V1PodTemplateSpec": "io.k8s.api.core.v1.PodTemplateSpec",
    "V1LabelSelector": "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "K8sIoApiAutoscalingV2MetricSpec": "io.k8s.api.autoscaling.v2.MetricSpec",
    "Quantity": "io.k8s.apimachinery.pkg.api.resource.Quantity",
}
_PRIMITIVES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "bool": {"type": "boolean"},
    "float": {"type": "number"},
    "object": {},
    "datetime": {"type": "string", "format": "date-time"},
}
_REQUIRED_RE = re.compile(r"Invalid value for `(\w+)`, must not be `None`")

_INT32 = {"type": "integer", "format": "int32", "minimum": -(2**31), "maximum": 2**31 - 1}
_QUANTITY = {"$ref": _K8S_DEFS + _K8S_TYPES["Quantity"]}
PODGROUP_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "scheduling.volcano.sh/v1beta1"},
        "kind": {"const": "PodGroup"},
        "metadata": {"$ref": _K8S_DEFS + _K8S_TYPES["V1ObjectMeta"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "minMember": _INT32,
                "minTaskMember": {"type": "object", "additionalProperties": _INT32},
                "queue": {"type": "string"},
                "priorityClassName": {"type": "string"},
                "minResources": {"type": "object", "additionalProperties": _QUANTITY},
            },
        },
        "status": {"type": "object"},
    },
}


@functools.cache
def _registry() -> Registry:
    root = importlib.resources.files("kubernetes_validate").joinpath(_SCHEMA_DIR)
    definitions = json.loads(root.joinpath("_definitions.json").read_text())
    return Resource.from_contents(definitions) @ Registry()


@dataclass(frozen=True)
class SdkModel:
    openapi_types: dict[str, str]
    attribute_map: dict[str, str]
    required: frozenset[str]


@functools.cache
def _sdk_models() -> dict[str, SdkModel]:
    """Every model class of kubeflow.training.models, by class name, read from its source."""
    spec = importlib.util.find_spec("kubeflow")  # the namespace only: runs no SDK code
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("kubeflow-training is not installed (pip install -e '.[test]')")
    models: dict[str, SdkModel] = {}
    for location in spec.submodule_search_locations:
        for path in sorted(Path(location, "training", "models").glob("kubeflow_org_v1_*.py")):
            source = path.read_text()
            for node in ast.parse(source).body:
                if isinstance(node, ast.ClassDef):
                    literals = {
                        target.id: ast.literal_eval(stmt.value)
                        for stmt in node.body
                        if isinstance(stmt, ast.Assign)
                        for target in stmt.targets
                        if isinstance(target, ast.Name)
                        and target.id in ("openapi_types", "attribute_map")
                    }
                    class_source = ast.get_source_segment(source, node) or ""
                    models[node.name] = SdkModel(
                        literals["openapi_types"],
                        literals["attribute_map"],
                        frozenset(_REQUIRED_RE.findall(class_source)),
                    )
    return models


def _type_schema(type_name: str, defs: dict[str, Any]) -> dict[str, Any]:
    if type_name.startswith("list[") and type_name.endswith("]"):
        return {"type": "array", "items": _type_schema(type_name[5:-1], defs)}
    match = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if match:
        return {"type": "object", "additionalProperties": _type_schema(match.group(1), defs)}
    if type_name in _PRIMITIVES:
        return dict(_PRIMITIVES[type_name])
    if type_name in _K8S_TYPES:
        return {"$ref": _K8S_DEFS + _K8S_TYPES[type_name]}
    if type_name.startswith("KubeflowOrgV1"):
        if type_name not in defs:
            defs[type_name] = {}  # placeholder first: models may refer to themselves
            defs[type_name] = _model_schema(_sdk_models()[type_name], defs)
        return {"$ref": f"#/$defs/{type_name}"}
    raise KeyError(f"no JSON schema mapping for SDK type {type_name!r}")


def _model_schema(model: SdkModel, defs: dict[str, Any]) -> dict[str, Any]:
    required = model.required
    properties = {
        model.attribute_map[attr]: _type_schema(type_name, defs)
        for attr, type_name in model.openapi_types.items()
    }
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = sorted(model.attribute_map[a] for a in required)
    return schema


@functools.cache
def training_operator_schema(kind: str) -> dict[str, Any]:
    """JSON schema of a kubeflow.org/v1 custom resource (PyTorchJob, TFJob, ...)."""
    sdk_name = {"PyTorchJob": "KubeflowOrgV1PyTorchJob", "TFJob": "KubeflowOrgV1TFJob"}[kind]
    defs: dict[str, Any] = {}
    schema = _model_schema(_sdk_models()[sdk_name], defs)
    schema["properties"]["apiVersion"] = {"const": "kubeflow.org/v1"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted(
        {*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"}
    )
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$defs"] = defs
    return schema


def custom_resource_schema(obj: dict[str, Any]) -> dict[str, Any]:
    if obj.get("apiVersion") == "kubeflow.org/v1":
        return training_operator_schema(obj["kind"])
    if (obj.get("apiVersion"), obj.get("kind")) == ("scheduling.volcano.sh/v1beta1", "PodGroup"):
        return PODGROUP_SCHEMA
    if obj.get("apiVersion") == "trainer.kubeflow.org/v1alpha1":
        from tests.kube.crds import trainer_schema  # the published CRD (tests/kube/upstream)

        return trainer_schema(obj["kind"])
    raise KeyError(f"no schema for {obj.get('apiVersion')} {obj.get('kind')}")


@functools.cache
def _custom_validator(api_version: str, kind: str) -> jsonschema.Validator:
    # Compiled once per kind: the Trainer's schemas are made strict from its CRD per call.
    schema = custom_resource_schema({"apiVersion": api_version, "kind": kind})
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def validate_custom(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless `obj` fits its CRD schema."""
    _custom_validator(obj.get("apiVersion", ""), obj.get("kind", "")).validate(obj)


@functools.cache
def _builtin_validator(api_version: str, kind: str) -> jsonschema.Validator:
    """The validator `kubernetes_validate.validate(..., strict=True)` builds for this kind,
    built once: the library parses the 1.4 MB definitions file on every call (~40 ms)."""
    # The library's file naming: rbac.authorization.k8s.io/v1 -> rbac-v1, v1 -> v1.
    prefix = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = importlib.resources.files("kubernetes_validate").joinpath(
        f"{_SCHEMA_DIR}/{kind.lower()}-{prefix}.json"
    )
    try:
        schema = json.loads(path.read_text())
    except FileNotFoundError:
        raise kubernetes_validate.SchemaNotFoundError(
            version=K8S_VERSION, kind=kind, api_version=api_version
        ) from None
    registry = Resource.from_contents(schema) @ _registry()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_builtin(obj: dict[str, Any]) -> None:
    """`kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)`, with
    the validator compiled once per kind; raises the library's ValidationError."""
    validator = _builtin_validator(obj["apiVersion"], obj["kind"])
    try:
        validator.validate(obj)
    except jsonschema.ValidationError as exc:
        raise kubernetes_validate.ValidationError(exc, version=K8S_VERSION) from None


def is_builtin(obj: dict[str, Any]) -> bool:
    group = obj["apiVersion"].rpartition("/")[0]
    return group in ("", "batch", "rbac.authorization.k8s.io", "apps", "networking.k8s.io")


def validate_manifest(obj: dict[str, Any]) -> None:
    """Validate any object mlcluster creates: built-in kinds with kubernetes-validate,
    custom resources with their CRD schema."""
    if is_builtin(obj):
        validate_builtin(obj)
    else:
        validate_custom(obj)
