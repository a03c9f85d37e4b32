"""Label and field selectors, parsed and matched the way the kube-apiserver does.

Label grammar (k8s.io/apimachinery/pkg/labels): comma-separated requirements, each one of
``key``, ``!key``, ``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)``,
``key notin (a,b)``, ``key>N``, ``key<N``. Field selectors allow ``=``, ``==``, ``!=`` only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_KEY = r"(?:[A-Za-z0-9.\-]+/)?[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_CMP_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>{_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")
_FIELD_RE = re.compile(r"^\s*(?P<key>[A-Za-z0-9_.\-]+)\s*(?P<op>==|!=|=)\s*(?P<value>[^,]*?)\s*$")


class SelectorError(ValueError):
    """The selector cannot be parsed or is not supported (the API answers 400 BadRequest)."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # 'exists', '!exists', '=', '!=', 'in', 'notin', '>', '<'
    values: tuple[str, ...] = ()

    def matches(self, get: Callable[[str], str | None]) -> bool:
        value = get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        if self.op in ("!=", "notin"):
            return value is None or value not in self.values
        try:
            number, bound = int(value or ""), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == ">" else number < bound


Selector = tuple[Requirement, ...]


def _split_top_level(text: str) -> list[str]:
    # Commas inside "in (a,b)" belong to the requirement, not to the selector.
    parts: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def parse_label_selector(text: str | None) -> Selector:
    requirements = []
    for part in _split_top_level(text or ""):
        if match := _SET_RE.match(part):
            values = tuple(v.strip() for v in match["values"].split(",") if v.strip())
            if not values:
                raise SelectorError(f"unable to parse requirement: {part.strip()!r}: empty set")
            requirements.append(Requirement(match["key"], match["op"], values))
        elif match := _CMP_RE.match(part):
            op = "=" if match["op"] in ("=", "==") else match["op"]
            requirements.append(Requirement(match["key"], op, (match["value"],)))
        elif match := _EXISTS_RE.match(part):
            requirements.append(Requirement(match["key"], "!exists" if match["neg"] else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
    return tuple(requirements)


def parse_field_selector(text: str | None, supported: frozenset[str]) -> Selector:
    requirements = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        match = _FIELD_RE.match(part)
        if not match:
            raise SelectorError(f"invalid selector: {part.strip()!r}; can't understand it")
        if match["key"] not in supported:
            raise SelectorError(f"field label not supported: {match['key']}")
        op = "=" if match["op"] in ("=", "==") else "!="
        requirements.append(Requirement(match["key"], op, (match["value"],)))
    return tuple(requirements)


def matches_labels(selector: Selector, obj: Mapping[str, Any]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(req.matches(labels.get) for req in selector)


def field_value(obj: Mapping[str, Any], path: str) -> str | None:
    """The value of a dotted field path as a field selector sees it (absent = empty string)."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matches_fields(selector: Selector, obj: Mapping[str, Any]) -> bool:
    return all(req.matches(lambda key: field_value(obj, key)) for req in selector)
