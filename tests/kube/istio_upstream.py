"""Validation of Istio objects against Istio's own CRDs (tests/kube/data/istio, upstream).

The openAPIV3Schema of the served version is applied with jsonschema, strictly: a field the
schema does not name is an error (a real API server would prune it silently, and a policy
missing a field is a policy that does something else). The CRDs' CEL rules
(`x-kubernetes-validations`) are evaluated too, with cel-python, on the node they sit on.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

# Functions of the Kubernetes CEL library (k8s.io/apiserver/pkg/cel/library) that plain CEL
# lacks; rules using them are not evaluated here.
KUBERNETES_CEL_LIBRARY = ("url", "isURL", "quantity", "ip", "cidr")
CRD_FILE = Path(__file__).parent / "data" / "istio" / "security-and-gateway-crds.yaml"


@functools.cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for crd in yaml.safe_load_all(CRD_FILE.read_text()):
        if crd:
            found[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd
    return found


def _strict(schema: Any) -> Any:
    """The schema with unknown properties forbidden where the CRD does not preserve them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if k != "x-kubernetes-validations"}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in schema
    ):
        out["additionalProperties"] = False
    return out


def schema_of(api_version: str, kind: str) -> dict[str, Any]:
    group, _, version = api_version.partition("/")
    crd = _crds()[(group, kind)]
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return served["schema"]["openAPIV3Schema"]


def _cel_rules(schema: Any, value: Any, path: str, errors: list[str]) -> None:
    if not isinstance(schema, dict) or value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        if any(f"{name}(" in rule["rule"] for name in KUBERNETES_CEL_LIBRARY):
            continue  # Kubernetes' own CEL extensions (url(), ...): not in a plain interpreter
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        try:
            ok = bool(program.evaluate({"self": celpy.json_to_cel(value)}))
        except celpy.CELEvalError as exc:
            ok, rule = False, {**rule, "message": f"{rule['rule']}: {exc}"}
        if not ok:
            errors.append(f"{path}: {rule.get('message') or rule['rule']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            _cel_rules(sub, value.get(key), f"{path}.{key}", errors)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _cel_rules(schema["items"], item, f"{path}[{index}]", errors)


def validate_istio_upstream(obj: dict[str, Any]) -> None:
    """Raise AssertionError listing every way ``obj`` breaks its upstream CRD."""
    schema = schema_of(obj["apiVersion"], obj["kind"])
    spec_schema = schema["properties"]["spec"]
    errors = [
        f"spec.{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(_strict(spec_schema)).iter_errors(obj.get("spec", {}))
    ]
    _cel_rules(spec_schema, obj.get("spec"), "spec", errors)
    assert not errors, f"{obj['kind']} {obj['metadata']['name']}: {errors}"
