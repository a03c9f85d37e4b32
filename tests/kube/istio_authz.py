"""Istio's AuthorizationPolicy decision for one request, for tests that play an attacker.

Follows Istio's documented semantics (https://istio.io/latest/docs/reference/config/security/
authorization-policy/ and .../concepts/security/#authorization): for a workload, if any DENY
policy matches the request it is denied; else, if there is any ALLOW policy for the workload,
the request must match one; else it is allowed. A policy matches when one of its rules does;
a rule matches when one of its `from` sources, one of its `to` operations (each field of a
source or operation must match) and every `when` condition match. String matching: exact,
prefix `abc*`, suffix `*abc`, or `*` (present, non-empty). `not*` fields invert. Only the
fields the shipped policies use are implemented; any other raises, so a policy that grows a
field cannot be silently misjudged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Request:
    path: str
    method: str = "GET"
    # mTLS identity of the caller (`cluster.local/ns/<ns>/sa/<sa>`); "" for plain text.
    principal: str = ""
    # `<iss>/<sub>` of a JWT the workload's RequestAuthentication verified; "" for none.
    request_principal: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    claims: Mapping[str, str] = field(default_factory=dict)


def _match(value: str, pattern: str) -> bool:
    if pattern == "*":
        return bool(value)
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return value.endswith(pattern[1:])
    return value == pattern


def _any(value: str, patterns: Iterable[str]) -> bool:
    return any(_match(value, p) for p in patterns)


_SOURCE = {"principals": "principal", "requestPrincipals": "request_principal"}
_OPERATION = {"paths": "path", "methods": "method"}


def _fields(spec: Mapping[str, Any], names: Mapping[str, str], request: Request) -> bool:
    for key, patterns in spec.items():
        negated = key.startswith("not")
        base = key[3].lower() + key[4:] if negated else key
        if base not in names:
            raise NotImplementedError(f"field {key} is not evaluated here")
        hit = _any(getattr(request, names[base]), patterns)
        if hit == negated:
            return False
    return True


def _condition(when: Mapping[str, Any], request: Request) -> bool:
    key: str = when["key"]
    if key.startswith("request.headers[") and key.endswith("]"):
        value = request.headers.get(key[len("request.headers[") : -1], "")
    elif key.startswith("request.auth.claims[") and key.endswith("]"):
        value = request.claims.get(key[len("request.auth.claims[") : -1], "")
    else:
        raise NotImplementedError(f"condition key {key} is not evaluated here")
    if "values" in when and not _any(value, when["values"]):
        return False
    return not ("notValues" in when and _any(value, when["notValues"]))


def _rule(rule: Mapping[str, Any], request: Request) -> bool:
    sources = rule.get("from")
    if sources and not any(_fields(s["source"], _SOURCE, request) for s in sources):
        return False
    operations = rule.get("to")
    if operations and not any(_fields(o["operation"], _OPERATION, request) for o in operations):
        return False
    return all(_condition(w, request) for w in rule.get("when") or [])


def _applies(policy: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> bool:
    if policy["metadata"]["namespace"] != namespace:
        return False
    wanted = ((policy["spec"].get("selector") or {}).get("matchLabels")) or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def allowed(
    policies: Sequence[Mapping[str, Any]],
    namespace: str,
    labels: Mapping[str, str],
    request: Request,
) -> bool:
    """Whether the workload (its namespace and pod labels) lets `request` through."""
    mine = [
        p
        for p in policies
        if p.get("kind") == "AuthorizationPolicy" and _applies(p, namespace, labels)
    ]
    for policy in mine:
        action = policy["spec"].get("action", "ALLOW")
        if action not in ("ALLOW", "DENY"):
            raise NotImplementedError(f"action {action} is not evaluated here")
    if any(
        p["spec"].get("action") == "DENY"
        and any(_rule(r, request) for r in p["spec"].get("rules") or [])
        for p in mine
    ):
        return False
    allows = [p for p in mine if p["spec"].get("action", "ALLOW") == "ALLOW"]
    if not allows:
        return True
    return any(any(_rule(r, request) for r in p["spec"].get("rules") or []) for p in allows)
