"""Evaluates a ValidatingAdmissionPolicy's CEL the way the API server does, for tests.

The policy's `variables` are computed in order (each may use the earlier ones), then every
`validations[].expression` must be true; a false one, or one that fails to evaluate (with
failurePolicy Fail), denies the request with its message. cel-python (`celpy`) is the CEL
interpreter: the expressions are the shipped policy's own, not restated here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import celpy
from celpy import celtypes


def _run(expression: str, activation: Mapping[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(dict(activation))


def matches(policy: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    """Whether the policy's matchConstraints cover this object's kind (by resource group)."""
    group = obj["apiVersion"].rpartition("/")[0] if "/" in obj["apiVersion"] else ""
    plural = obj["kind"].lower() + "s"
    return any(
        group in rule["apiGroups"] and plural in rule["resources"]
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
    )


def denials(policy: Mapping[str, Any], obj: Mapping[str, Any]) -> list[str]:
    """The messages the API server would deny ``obj`` with ([] = admitted)."""
    if not matches(policy, obj):
        return []
    variables: dict[Any, Any] = {}
    activation: dict[str, Any] = {"object": celpy.json_to_cel(dict(obj))}
    for variable in policy["spec"].get("variables") or []:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = _run(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    denied = []
    for validation in policy["spec"]["validations"]:
        result = _run(validation["expression"], activation)
        if not (isinstance(result, celtypes.BoolType) and bool(result)):  # false or an error
            denied.append(validation.get("message") or validation["expression"])
    return denied
