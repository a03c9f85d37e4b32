"""The REST API's OpenAPI 3.1 document (`openapi.yaml`, next to this module) and request
validation against it.

The YAML file is the contract: the handlers validate bodies and query parameters with the
very schemas published at `/mlcluster/api/openapi.json` (OpenAPI 3.1 schemas are JSON Schema
2020-12), and the sidebar's TypeScript types are generated from it. A few values are only
known when the server starts (its version, URL and the largest `workers`), the shared
text patterns come from `jupyterlab_mlcluster.patterns` and the numeric bounds of a job's
options from `jupyterlab_mlcluster.bounds`: `build_document` fills them in.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .. import bounds, patterns
from .._version import __version__

API_PREFIX = "/mlcluster/api"
DOCUMENT_PATH = Path(__file__).with_name("openapi.yaml")


@functools.lru_cache(maxsize=1)
def static_document() -> dict[str, Any]:
    """`openapi.yaml` as it is in the package (parsed once per process; do not modify)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with DOCUMENT_PATH.open(encoding="utf-8") as file:
        return yaml.load(file, Loader=loader)  # a safe loader: plain data only


def build_document(*, max_workers: int, server_url: str = API_PREFIX) -> dict[str, Any]:
    """The whole OpenAPI document of this server: the static file with its runtime values
    filled in; `server_url` is the API's base (with the server's base_url)."""
    document = _fill_extensions(copy.deepcopy(static_document()))
    document["info"]["version"] = __version__
    document["servers"] = [{"url": server_url}]
    schemas = document["components"]["schemas"]
    workers = schemas["JobSubmission"]["properties"]["workers"]
    workers["maximum"] = min(max_workers, workers["maximum"])
    return document


def _fill_extensions(node: Any) -> Any:
    """Every `x-pattern: <name>` becomes `pattern: <the regex of that name>` and every
    `x-bounds: <name>` the JSON Schema bounds of that name, in place."""
    if isinstance(node, dict):
        for key, fill in _EXTENSIONS.items():
            name = node.pop(key, None)
            if name is not None:
                try:
                    node.update(fill(name))
                except KeyError:
                    raise ValueError(f"{DOCUMENT_PATH.name}: unknown {key} {name!r}") from None
        for value in node.values():
            _fill_extensions(value)
    elif isinstance(node, list):
        for value in node:
            _fill_extensions(value)
    return node


_EXTENSIONS: dict[str, Callable[[str], dict[str, Any]]] = {
    "x-pattern": lambda name: {"pattern": patterns.BY_NAME[name]},
    "x-bounds": lambda name: bounds.BY_NAME[name].schema(),
}


# -- validation --------------------------------------------------------------------------


def _ecma_pattern(validator, pattern: str, instance: Any, schema: dict[str, Any]):
    # JSON Schema patterns are ECMA-262, where `$` matches only at the very end; Python's
    # `$` also matches before a trailing newline, which would let "name\n" through.
    if isinstance(instance, str) and not patterns.matches(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _ecma_pattern}
)


# Query parameters jupyter_server itself reads on every request.
JUPYTER_QUERY_PARAMETERS = frozenset({"token", "_xsrf", "no_track_activity"})


class RequestError(ValueError):
    """A request that does not match the document; the message names what is wrong."""


class Validators:
    """Validators for one document's request bodies and parameters (built once per server)."""

    def __init__(self, document: dict[str, Any]):
        self.document = document
        self._cache: dict[str, Any] = {}

    def _validator(self, schema: dict[str, Any]):
        key = json.dumps(schema, sort_keys=True)
        validator = self._cache.get(key)
        if validator is None:
            root = {**schema, "components": self.document["components"]}
            validator = _Validator(root, format_checker=_Validator.FORMAT_CHECKER)
            self._cache[key] = validator
        return validator

    def check(self, schema: dict[str, Any], value: Any, what: str) -> None:
        error = jsonschema.exceptions.best_match(self._validator(schema).iter_errors(value))
        if error is not None:
            where = what + "".join(
                f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
            )
            raise RequestError(f"{where}: {_describe(error)}")

    def body(self, path: str, method: str, raw: bytes) -> Any:
        """Parse and validate a JSON request body of an operation."""
        operation = self.document["paths"][path][method]
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        try:
            value = json.loads(raw or b"null", parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise RequestError(f"the request body must be JSON: {exc}") from None
        if value is None:
            raise RequestError("the request body must be a JSON object")
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                "the request body must be valid Unicode (it has a lone surrogate)"
            ) from None
        self.check(schema, value, "body")
        return value

    def query(self, path: str, method: str, arguments: dict[str, list[bytes]]) -> dict[str, Any]:
        """Query parameters of an operation, converted to their schema types and validated.

        Unknown ones are refused (a misspelt filter must not silently match everything),
        except those every Jupyter API takes (token, _xsrf, no_track_activity) and the
        all-digit cache-buster JupyterLab's ServerConnection appends to GETs (`?1795317812852`)."""
        declared = [p for p in self.parameters(path, method) if p["in"] == "query"]
        unknown = sorted(
            name
            for name in set(arguments) - {p["name"] for p in declared} - JUPYTER_QUERY_PARAMETERS
            if not (name.isdigit() and not arguments[name][0])
        )
        if unknown:
            takes = ", ".join(p["name"] for p in declared) or "none"
            raise RequestError(
                f"unknown query parameter(s): {', '.join(unknown)} (this operation takes: {takes})"
            )
        values: dict[str, Any] = {}
        for param in declared:
            name, schema = param["name"], param["schema"]
            raw = [v.decode("utf-8", "replace") for v in arguments.get(name, [])]
            if not raw:
                if "default" in schema:
                    values[name] = schema["default"]
                continue
            value = _convert(name, schema, raw)
            self.check(schema, value, name)
            values[name] = value
        return values

    def parameters(self, path: str, method: str) -> list[dict[str, Any]]:
        item = self.document["paths"][path]
        declared = [*item.get("parameters", []), *item[method].get("parameters", [])]
        return [self._resolve(p) for p in declared]

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        """A `{"$ref": "#/components/..."}` replaced by what it points at."""
        ref = node.get("$ref")
        if ref is None:
            return node
        target: Any = self.document
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return target


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _convert(name: str, schema: dict[str, Any], raw: list[str]) -> Any:
    kind = schema.get("type")
    if kind == "array":
        # Repeated (?state=a&state=b) or comma separated (?state=a,b), or both.
        return [part for value in raw for part in value.split(",") if part]
    if len(raw) > 1:
        raise RequestError(f"{name}: give it once, not {len(raw)} times")
    text = raw[0]
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise RequestError(f"{name}: must be an integer, got {shortened(repr(text))}") from None
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise RequestError(f"{name}: must be a number, got {shortened(repr(text))}")
        return number
    if kind == "boolean":
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise RequestError(f"{name}: must be true or false, got {shortened(repr(text))}")
    return text


# Most characters of a request's own value a validation message repeats: an error must not
# send a huge value back (nor cost the server its copies).
ECHO_CHARS = 200
MESSAGE_CHARS = 2000


def shortened(text: str, limit: int = ECHO_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and error.validator_value is False:
        message = error.message.replace(
            "Additional properties are not allowed", "unknown option(s)"
        )
        return shortened(message, MESSAGE_CHARS)
    echoed = repr(error.instance)
    if error.validator == "oneOf":
        schema = error.schema if isinstance(error.schema, Mapping) else {}  # (always one)
        description = schema.get("description", "see the API document")
        return f"{shortened(echoed)} is not valid ({description})"
    message = error.message
    if len(echoed) > ECHO_CHARS:
        message = message.replace(echoed, shortened(echoed))
    return shortened(message, MESSAGE_CHARS)
