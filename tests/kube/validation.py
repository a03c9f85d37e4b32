"""Schema validation the way the emulated API server applies it on every write.

- Built-in kinds: the strict JSON schemas of ``kubernetes_validate`` for Kubernetes 1.33 (the
  same files ``kubernetes_validate.validate(obj, desired_version='1.33', strict=True)`` uses;
  compiled once per kind here, because loading them per call costs ~25 ms). Unknown fields are
  rejected with 422, stricter than a real server's default (drop and warn).
- Custom resources: the version's ``openAPIV3Schema`` from the installed CRD. Unknown fields are
  pruned and ``default``s applied, as the kube-apiserver does for structural schemas (with a
  ``Warning`` header; ``?fieldValidation=Strict`` rejects them instead); then the object is
  validated. CEL rules (``x-kubernetes-validations``) and list-type uniqueness are not checked.

Each schema is also compiled by ``jsonschema_rs`` where it is installed: a valid object (nearly
every write) is answered by it, in microseconds where jsonschema takes 1-2 ms (most of the
emulator's time in a burst of creates; a kube-apiserver validates in compiled code too). An
object it finds invalid is validated again by jsonschema, whose errors the API reports.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

try:
    import jsonschema_rs
except ImportError:  # the fast path is optional: jsonschema alone gives the same answers
    jsonschema_rs = None

KUBERNETES_VERSION = "1.33"


@dataclass(frozen=True)
class Cause:
    field: str
    message: str
    reason: str = "FieldValueInvalid"


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@functools.cache
def _schema_dir() -> str:
    version = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= KUBERNETES_VERSION][
        -1
    ]
    return f"kubernetes-json-schema/v{version}-local-strict"


@functools.cache
def _definitions() -> Resource:
    contents = kv_utils.schema_contents(f"{_schema_dir()}/_definitions.json", KUBERNETES_VERSION)
    return Resource.from_contents(contents)


@functools.cache
def _builtin_validator(api_version: str, kind: str) -> jsonschema.Validator | None:
    # Same file naming as kubernetes_validate.validate(): rbac.authorization.k8s.io/v1 -> rbac-v1.
    group, _, version = api_version.rpartition("/")
    prefix = f"{group.split('.')[0]}-{version}" if group else version
    try:
        schema = kv_utils.schema_contents(
            f"{_schema_dir()}/{kind.lower()}-{prefix}.json", KUBERNETES_VERSION
        )
    except FileNotFoundError:
        return None
    registry = _definitions() @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _object_meta_validator() -> jsonschema.Validator:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    }
    return jsonschema.Draft202012Validator(schema, registry=_definitions() @ Registry())


# id(jsonschema validator) -> (that validator, its jsonschema_rs twin or None). The
# validators are made once each (functools.cache above), so this stays small.
_FAST: dict[int, tuple[jsonschema.Validator, Any]] = {}


def _fast_twin(validator: jsonschema.Validator) -> Any:
    """`validator`'s schema compiled by jsonschema_rs (None without it, or if it cannot)."""
    known = _FAST.get(id(validator))
    if known is not None and known[0] is validator:
        return known[1]
    twin = None
    if jsonschema_rs is not None:
        definitions = _definitions().contents
        registry = jsonschema_rs.Registry([(definitions["$id"], definitions)])
        try:
            # Formats are annotations in 2020-12 unless asked for, as for jsonschema here.
            twin = jsonschema_rs.Draft202012Validator(
                validator.schema, registry=registry, validate_formats=False
            )
        except Exception:  # noqa: BLE001 - a schema it cannot compile: jsonschema alone
            twin = None
    _FAST[id(validator)] = (validator, twin)
    return twin


def _causes(validator: jsonschema.Validator, obj: Any, prefix: tuple[Any, ...] = ()) -> list[Cause]:
    twin = _fast_twin(validator)
    if twin is not None and twin.is_valid(obj):
        return []
    causes = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        reason = (
            "FieldValueRequired"
            if error.validator == "required"
            else (
                "FieldValueNotSupported"
                if error.validator in ("enum", "additionalProperties")
                else "FieldValueInvalid"
            )
        )
        causes.append(Cause(_path((*prefix, *error.absolute_path)), error.message, reason))
    return causes


def has_builtin_schema(api_version: str, kind: str) -> bool:
    return _builtin_validator(api_version, kind) is not None


def validate_builtin(obj: Mapping[str, Any]) -> list[Cause]:
    validator = _builtin_validator(obj["apiVersion"], obj["kind"])
    return _causes(validator, obj) if validator is not None else []


def validate_builtin_uncached(obj: Mapping[str, Any]) -> list[str]:
    """The library's own entry point; used by tests to prove the cache agrees with it."""
    try:
        kubernetes_validate.validate(dict(obj), desired_version=KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [exc.message]
    return []


def _to_json_schema(schema: Any) -> Any:
    """OpenAPI v3 (structural, with x-kubernetes-* extensions) -> JSON Schema 2020-12."""
    if isinstance(schema, list):
        return [_to_json_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    result = {
        key: _to_json_schema(value)
        for key, value in schema.items()
        # properties: converted once, below (converting it here too doubled the work at
        # every level: minutes for the Kubeflow Trainer's deep schemas)
        if not key.startswith("x-kubernetes-") and key not in ("nullable", "properties")
    }
    if schema.get("x-kubernetes-int-or-string") and "type" not in schema:
        result.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and "type" in result:
        result["type"] = [result["type"], "null"]
        if "enum" in result:
            result["enum"] = [*result["enum"], None]
    if "properties" in schema:
        result["properties"] = {k: _to_json_schema(v) for k, v in schema["properties"].items()}
    return result


@functools.cache
def _custom_validator_cached(schema_key: str) -> jsonschema.Validator:
    import json

    schema = _to_json_schema(json.loads(schema_key))
    # Metadata is validated as ObjectMeta, whatever the CRD says about it.
    schema.get("properties", {}).pop("metadata", None)
    return jsonschema.Draft202012Validator(schema)


# id(schema) -> (that schema, its validator): a CRD's schema object is the catalogue's, the
# same for every write of its kind, and its canonical JSON (the cache key above) took longer
# to make than the validation itself (an Istio VirtualService's schema is some 100 KiB).
_BY_SCHEMA: dict[int, tuple[Mapping[str, Any], jsonschema.Validator]] = {}


def _custom_validator(schema: Mapping[str, Any]) -> jsonschema.Validator:
    import json

    known = _BY_SCHEMA.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    validator = _custom_validator_cached(json.dumps(schema, sort_keys=True))
    if len(_BY_SCHEMA) > 256:  # schemas of CRDs since removed: forget them all
        _BY_SCHEMA.clear()
    _BY_SCHEMA[id(schema)] = (schema, validator)
    return validator


def prune_and_default(
    obj: Any, schema: Mapping[str, Any] | None, path: str = ""
) -> tuple[Any, list[str]]:
    """Drop fields the structural schema does not know and fill in defaults (returns copies)."""
    if schema is None or not isinstance(obj, (dict, list)):
        return obj, []
    unknown: list[str] = []
    if isinstance(obj, list):
        items = schema.get("items")
        result_list = []
        for index, item in enumerate(obj):
            pruned, lost = prune_and_default(item, items, f"{path}[{index}]")
            result_list.append(pruned)
            unknown += lost
        return result_list, unknown
    properties = schema.get("properties")
    additional = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    result: dict[str, Any] = {}
    for key, value in obj.items():
        sub = (properties or {}).get(key)
        if sub is None and isinstance(additional, Mapping):
            sub = additional
        if (
            sub is None
            and not preserve
            and (properties is not None or additional is False or schema.get("type") == "object")
        ):
            if not (path == "" and key in ("apiVersion", "kind", "metadata")):
                unknown.append(f"{path}.{key}" if path else key)
                continue
        if path == "" and key == "metadata":
            # ObjectMeta is the apiserver's own, never pruned by a CRD's schema (which may
            # say no more than `type: object` about it, as controller-gen writes). Kept as the
            # same object: the write path goes on editing it (generation, resourceVersion).
            result[key] = value
            continue
        pruned, lost = prune_and_default(value, sub, f"{path}.{key}" if path else key)
        result[key] = pruned
        unknown += lost
    for key, sub in (properties or {}).items():
        if key not in result and isinstance(sub, Mapping) and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
    return result, unknown


def validate_custom(obj: Mapping[str, Any], schema: Mapping[str, Any] | None) -> list[Cause]:
    causes = _causes(_object_meta_validator(), obj.get("metadata", {}), ("metadata",))
    if schema is not None:
        causes += _causes(_custom_validator(schema), obj)
    return causes
