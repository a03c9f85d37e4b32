"""The emulator's schema validation: jsonschema_rs answers for the valid objects, and every
answer is jsonschema's (the controller's children and the Notebook, valid and broken)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from notebook_controller import objects
from notebook_controller.config import ControllerConfig
from notebook_controller.crd import notebook_crd
from tests.kube import validation
from tests.kube.istio import istio_crds

pytest.importorskip("jsonschema_rs")


def _schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def _cases() -> list[tuple[str, Any, dict[str, Any]]]:
    """(what, jsonschema validator, object) for each kind the controller writes."""
    notebook = objects.notebook_resource("nb", "team", "alice@example.com")
    notebook["metadata"]["uid"] = "0f1e2d3c"
    crds = {crd["spec"]["names"]["kind"]: crd for crd in [notebook_crd(), *istio_crds()]}
    cases = []
    for obj in [
        notebook,
        *objects.desired_children(notebook, ControllerConfig(), objects.IstioVersions("v1", "v1")),
    ]:
        kind = obj["kind"]
        if kind in crds:
            schema = _schema(crds[kind], obj["apiVersion"].rpartition("/")[2])
            cases.append((f"{kind} metadata", validation._object_meta_validator(), obj["metadata"]))
            cases.append((kind, validation._custom_validator(schema), obj))
        else:
            builtin = validation._builtin_validator(obj["apiVersion"], kind)
            assert builtin is not None, kind
            cases.append((kind, builtin, obj))
    return cases


def _broken(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Variants of `obj` that a schema refuses: a wrong type at the top and deeper down, an
    unknown field (refused by the strict built-in schemas), a required field missing."""
    variants = []
    for key in ("spec", "metadata", "name"):
        if key in obj:
            wrong = copy.deepcopy(obj)
            wrong[key] = 7
            variants.append(wrong)
    if isinstance(obj.get("spec"), dict) and obj["spec"]:
        first = next(iter(obj["spec"]))
        deeper = copy.deepcopy(obj)
        deeper["spec"][first] = [{"no": "such"}] if not isinstance(obj["spec"][first], list) else 7
        variants.append(deeper)
        unknown = copy.deepcopy(obj)
        unknown["spec"]["noSuchField"] = {"x": 1}
        variants.append(unknown)
    if obj.get("kind") == "StatefulSet":
        missing = copy.deepcopy(obj)
        del missing["spec"]["selector"]
        variants.append(missing)
    return variants


@pytest.mark.parametrize(
    "what,validator,obj", _cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_the_compiled_twin_gives_jsonschemas_answer(what, validator, obj):
    twin = validation._fast_twin(validator)
    assert twin is not None, f"{what}: no jsonschema_rs twin (every write validated slowly)"
    assert list(validator.iter_errors(obj)) == []
    assert twin.is_valid(obj) and validation._causes(validator, obj) == []
    refused = 0
    for broken in _broken(obj):
        expected = sorted(e.message for e in validator.iter_errors(broken))
        assert twin.is_valid(broken) == (not expected), (what, broken, expected)
        assert sorted(c.message for c in validation._causes(validator, broken)) == expected
        refused += bool(expected)
    assert refused, f"{what}: no broken variant was refused (the test proves nothing)"
