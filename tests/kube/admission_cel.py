"""Evaluates a ValidatingAdmissionPolicy's CEL the way the API server does, for tests.

The policy's `matchConditions` decide first whether it applies at all (all must be true; they
see `request` too, e.g. `request.userInfo.username`), then its `variables` are computed in
order (each may use the earlier ones), then every `validations[].expression` must be true; a false one, or one that fails to evaluate (with
failurePolicy Fail), denies the request with its message. cel-python (`celpy`) is the CEL
interpreter: the expressions are the shipped policy's own, not restated here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import celpy
from celpy import celtypes


@functools.cache
def _program(expression: str) -> Any:
    # Compiling is most of the cost (seconds for the pod-template policy) and a pure
    # function of the text; evaluating a compiled program keeps no state between calls.
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _run(expression: str, activation: Mapping[str, Any]) -> Any:
    return _program(expression).evaluate(dict(activation))


def matches(policy: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
    """Whether the policy's matchConstraints cover this object's kind (by resource group)."""
    group = obj["apiVersion"].rpartition("/")[0] if "/" in obj["apiVersion"] else ""
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind[-1:] == "y" and kind[-2:-1] not in "aeiou" else kind + "s"
    return any(
        group in rule["apiGroups"] and plural in rule["resources"]
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
    )


def bound(
    bindings: Sequence[Mapping[str, Any]], policy: Mapping[str, Any], labels: Mapping[str, str]
) -> bool:
    """Whether one of `bindings` applies `policy` in a namespace with these labels (no
    namespaceSelector: every namespace). Only `matchLabels` selectors are evaluated here."""
    for binding in bindings:
        if binding["spec"]["policyName"] != policy["metadata"]["name"]:
            continue
        selector = binding["spec"]["matchResources"].get("namespaceSelector")
        if selector and set(selector) - {"matchLabels"}:
            raise NotImplementedError(f"namespaceSelector {selector} is not evaluated here")
        wanted = (selector or {}).get("matchLabels") or {}
        if all(labels.get(k) == v for k, v in wanted.items()):
            return True
    return False


def denials(
    policy: Mapping[str, Any],
    obj: Mapping[str, Any],
    request: Mapping[str, Any] | None = None,
) -> list[str]:
    """The messages the API server would deny ``obj`` with ([] = admitted). `request`: the
    admission request's fields the policy's CEL reads (`userInfo`, `namespace`, ...)."""
    if not matches(policy, obj):
        return []
    variables: dict[Any, Any] = {}
    activation: dict[str, Any] = {"object": celpy.json_to_cel(dict(obj))}
    conditions = policy["spec"].get("matchConditions") or []
    if conditions and request is None:
        raise ValueError("this policy has matchConditions: give the request they judge")
    if request is not None:
        activation["request"] = celpy.json_to_cel(dict(request))
    for condition in conditions:
        result = _run(condition["expression"], activation)
        if not isinstance(result, celtypes.BoolType):
            raise ValueError(f"matchCondition {condition['name']} gave {result!r}")
        if not bool(result):
            return []  # the policy does not apply to this request
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
