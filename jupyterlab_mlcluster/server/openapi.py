"""The REST API's OpenAPI 3.1 document, as data, and request validation against it.

This module is the one source of truth for request shapes: the handlers validate bodies
and query parameters with the very schemas published at `/mlcluster/api/openapi.json`
(OpenAPI 3.1 schemas are JSON Schema 2020-12). A few limits come from configuration
(e.g. the largest `workers`), so the document is built per server, not a constant.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import jsonschema

from .._version import __version__
from ..jobs.model import BACKENDS, FRAMEWORKS, RESERVED_ENV, JobState, RankState

API_PREFIX = "/mlcluster/api"

NULLABLE_STRING = {"type": ["string", "null"]}
NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_NUMBER = {"type": ["number", "null"]}

# Patterns mirror what jobs/model.py accepts, made strict enough that everything the
# schema accepts is also accepted by the engine (no "valid" request gets a 400).
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,51}[a-z0-9])?$"
JOB_REF_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
MEMORY_PATTERN = (
    r"^[1-9][0-9]{0,17}(\.[0-9]{1,6})?(Ki|Mi|Gi|Ti|Pi|Ei|kB|KB|MB|GB|TB|PB|EB|k|K|M|G|T|P|E|B)?$"
)
DURATION_PATTERN = (
    r"^[1-9][0-9]{0,8}(\.[0-9]{1,6})?((ms|s|m|h|d)([0-9]{1,9}(\.[0-9]{1,6})?(ms|s|m|h|d)){0,4})?$"
)
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Container image references and scheduler queue names, in plain ASCII (regex dialects
# disagree on what `\s` means beyond it).
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$"
QUEUE_PATTERN = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"
CURSOR_PATTERN = r"^[0-9]{1,6}:[0-9]{1,18}(,[0-9]{1,6}:[0-9]{1,18}){0,1023}$"
# DNS-1123 label, short enough to leave room for the suffixes of the objects it names.
NOTEBOOK_NAME_PATTERN = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$"
MAX_CODE_CHARS = 4 * 1024 * 1024


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


FORBIDDEN = _error("Not authenticated, or not authorized for this resource")
UNKNOWN_JOB = _error("No such job (or not a valid job id)")
NO_CLUSTER = _error("No Kubernetes cluster is configured for this server, or it cannot be reached")
API_REFUSED = _error("The Kubernetes API refused the request (e.g. missing RBAC permissions)")

JOB_REF = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "A job id, or a job name (then the newest job of that name).",
    "schema": {"type": "string", "pattern": JOB_REF_PATTERN},
}
NOTEBOOK_REF = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "The notebook server's name.",
    "schema": {"type": "string", "pattern": NOTEBOOK_NAME_PATTERN},
}


def _schemas(max_workers: int) -> dict[str, Any]:
    rank_metrics = {
        "type": "object",
        "properties": {
            "cpu_percent": NULLABLE_NUMBER,
            "memory_bytes": NULLABLE_INT,
            "gpu_util": NULLABLE_NUMBER,
            "gpu_memory_bytes": NULLABLE_INT,
        },
        "required": ["cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes"],
    }
    capacity_pair = {
        "type": "object",
        "properties": {"total": NULLABLE_NUMBER, "free": NULLABLE_NUMBER},
        "required": ["total", "free"],
    }
    return {
        "Error": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
        "JobSubmission": {
            "type": "object",
            "description": "The %%distributed options in snake_case, plus the code every rank runs.",
            "additionalProperties": False,
            "required": ["code"],
            "properties": {
                "code": {
                    "type": "string",
                    "maxLength": MAX_CODE_CHARS,
                    "description": "Python source run as __main__ on every rank.",
                },
                "workers": {"type": "integer", "minimum": 1, "maximum": max_workers},
                "gpus_per_worker": {"type": "integer", "minimum": 0, "maximum": 1024},
                "cpus": {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000},
                "memory": {
                    "description": "Memory per rank: bytes, or a size like '4Gi', '512Mi', '2GB'.",
                    "oneOf": [
                        {"type": "integer", "minimum": 1, "maximum": 2**62},
                        {"type": "string", "pattern": MEMORY_PATTERN},
                    ],
                },
                "framework": {"enum": list(FRAMEWORKS)},
                "backend": {"enum": list(BACKENDS)},
                "image": {"type": "string", "pattern": IMAGE_PATTERN},
                "name": {"type": "string", "pattern": NAME_PATTERN},
                "env": {
                    "type": "object",
                    "maxProperties": 256,
                    "propertyNames": {
                        "pattern": ENV_NAME_PATTERN,
                        "not": {"enum": sorted(RESERVED_ENV)},
                    },
                    "additionalProperties": {
                        "type": "string",
                        "maxLength": 65536,
                        "pattern": "^[^\\u0000]*$",
                    },
                },
                "timeout": {
                    "description": "Fail the job after this long: seconds, or a duration like '30m', '1h30m'.",
                    "oneOf": [
                        {"type": "number", "exclusiveMinimum": 0, "maximum": 1e9},
                        {"type": "string", "pattern": DURATION_PATTERN},
                    ],
                },
                "max_restarts": {"type": "integer", "minimum": 0, "maximum": 1000},
                "queue": {"type": "string", "pattern": QUEUE_PATTERN},
                "priority": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
                "pull": {
                    "type": "array",
                    "description": "Variables of rank 0 to keep as the job's result (see /jobs/{id}/result).",
                    "items": {"type": "string", "pattern": IDENTIFIER_PATTERN},
                    "maxItems": 64,
                    "uniqueItems": True,
                },
            },
        },
        "Rank": {
            "type": "object",
            "properties": {
                "rank": {"type": "integer", "minimum": 0},
                "state": {"enum": [str(s) for s in RankState]},
                "exit_code": NULLABLE_INT,
                "pid": NULLABLE_INT,
                "host": NULLABLE_STRING,
                "started": NULLABLE_TIME,
                "finished": NULLABLE_TIME,
                "metrics": _ref("RankMetrics"),
                "progress": {
                    "type": ["object", "null"],
                    "properties": {
                        "step": NULLABLE_NUMBER,
                        "total": NULLABLE_NUMBER,
                        "desc": NULLABLE_STRING,
                    },
                },
            },
            "required": [
                "rank",
                "state",
                "exit_code",
                "pid",
                "host",
                "started",
                "finished",
                "metrics",
                "progress",
            ],
        },
        "RankMetrics": rank_metrics,
        "Job": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "name": {"type": "string"},
                "state": {"enum": [str(s) for s in JobState]},
                "backend": {"enum": list(BACKENDS)},
                "workers": {"type": "integer", "minimum": 1},
                "gpus_per_worker": {"type": "integer", "minimum": 0},
                "cpus": {"type": "number"},
                "memory": NULLABLE_INT,
                "framework": {"enum": list(FRAMEWORKS)},
                "image": NULLABLE_STRING,
                "queue": NULLABLE_STRING,
                "priority": {"type": "integer"},
                "timeout": NULLABLE_NUMBER,
                "max_restarts": {"type": "integer", "minimum": 0},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "created": {"type": "string", "format": "date-time"},
                "started": NULLABLE_TIME,
                "finished": NULLABLE_TIME,
                "error": NULLABLE_STRING,
                "failed_rank": NULLABLE_INT,
                "reason": NULLABLE_STRING,
                "restarts": {"type": "integer", "minimum": 0},
                "queue_position": NULLABLE_INT,
                "owner": NULLABLE_STRING,
                "origin": {"type": "object", "properties": {"kind": {"type": "string"}}},
                "has_result": {"type": "boolean"},
                "ranks": {"type": "array", "items": _ref("Rank")},
            },
            "required": [
                "id",
                "name",
                "state",
                "backend",
                "workers",
                "gpus_per_worker",
                "cpus",
                "memory",
                "framework",
                "image",
                "queue",
                "priority",
                "timeout",
                "max_restarts",
                "env",
                "created",
                "started",
                "finished",
                "error",
                "failed_rank",
                "reason",
                "restarts",
                "queue_position",
                "owner",
                "origin",
                "has_result",
                "ranks",
            ],
        },
        "JobList": {
            "type": "object",
            "properties": {
                "jobs": {"type": "array", "items": _ref("Job")},
                "total": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Jobs matching the filters.",
                },
                "limit": {"type": "integer"},
                "offset": {"type": "integer"},
            },
            "required": ["jobs", "total", "limit", "offset"],
        },
        "LogLine": {
            "type": "object",
            "properties": {
                "rank": {"type": "integer", "minimum": 0},
                "ts": {"type": "string", "format": "date-time"},
                "stream": {"enum": ["stdout", "stderr", "system"]},
                "line": {"type": "string"},
                "cursor": {
                    "type": "string",
                    "description": "On the last line of each streamed batch (follow=true): pass as `since` to resume after it.",
                },
            },
            "required": ["rank", "ts", "stream", "line"],
        },
        "LogPage": {
            "type": "object",
            "properties": {
                "lines": {"type": "array", "items": _ref("LogLine")},
                "cursor": {
                    "type": "string",
                    "description": "Per-rank byte offsets; pass as `since` to continue after these lines.",
                },
            },
            "required": ["lines", "cursor"],
        },
        "MetricsSample": {
            "type": "object",
            "properties": {
                "ts": {"type": "number", "description": "Epoch seconds."},
                **rank_metrics["properties"],
            },
            "required": ["ts", *rank_metrics["required"]],
        },
        "JobMetrics": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "ranks": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "rank": {"type": "integer", "minimum": 0},
                            "current": _ref("RankMetrics"),
                            "series": {"type": "array", "items": _ref("MetricsSample")},
                        },
                        "required": ["rank", "current", "series"],
                    },
                },
            },
            "required": ["id", "ranks"],
        },
        "JobResult": {
            "type": "object",
            "properties": {
                "kind": {
                    "enum": ["value", "pull", "none"],
                    "description": "value: rank 0's last expression; pull: {name: value} of the pulled "
                    "variables; none: the job produced no result.",
                },
                "value": {},
            },
            "required": ["kind", "value"],
        },
        "Cluster": {
            "type": "object",
            "properties": {
                "backend": {"enum": list(BACKENDS)},
                "capacity": {
                    "type": "object",
                    "properties": {
                        "gpus": capacity_pair,
                        "cpus": capacity_pair,
                        "memory": capacity_pair,
                    },
                    "required": ["gpus", "cpus", "memory"],
                },
                "queue": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Queued job ids in admission order.",
                },
                "running": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["backend", "capacity", "queue"],
        },
        "NotebookRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": NOTEBOOK_NAME_PATTERN},
                "image": {"type": "string", "pattern": IMAGE_PATTERN},
                "cpus": {"type": "number", "exclusiveMinimum": 0, "maximum": 1024},
                "memory": {"type": "string", "pattern": MEMORY_PATTERN},
                "gpus": {"type": "integer", "minimum": 0, "maximum": 64},
                "workspace_size": {
                    "type": "string",
                    "pattern": MEMORY_PATTERN,
                    "description": "Size of a persistent workspace volume (none if absent).",
                },
            },
        },
        "Notebook": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "owner": NULLABLE_STRING,
                "image": NULLABLE_STRING,
                "phase": {"type": "string", "description": "Readable phase from the controller."},
                "ready": {"type": "boolean"},
                "stopped": {"type": "boolean"},
                "url": NULLABLE_STRING,
                "created": NULLABLE_TIME,
                "conditions": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["name", "namespace", "owner", "phase", "ready", "stopped", "url"],
        },
        "NotebookList": {
            "type": "object",
            "properties": {"notebooks": {"type": "array", "items": _ref("Notebook")}},
            "required": ["notebooks"],
        },
        "Event": {
            "description": "One websocket message of /events (a JSON text frame). Every message also "
            "carries `seq`, an integer that grows with the time the message was made: a client may drop "
            "a message whose seq is below one it already applied (e.g. below the snapshot's).",
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "snapshot"},
                        "jobs": {"type": "array", "items": _ref("Job")},
                        "total": {"type": "integer"},
                        "cluster": _ref("Cluster"),
                    },
                    "required": ["type", "jobs", "cluster"],
                },
                {
                    "type": "object",
                    "properties": {"type": {"const": "job"}, "job": _ref("Job")},
                    "required": ["type", "job"],
                },
                {
                    "type": "object",
                    "properties": {"type": {"enum": ["deleted", "logs"]}, "id": {"type": "string"}},
                    "required": ["type", "id"],
                },
                {
                    "type": "object",
                    "properties": {"type": {"const": "cluster"}, "cluster": _ref("Cluster")},
                    "required": ["type", "cluster"],
                },
                {
                    "type": "object",
                    "properties": {"type": {"const": "notebook"}, "notebook": _ref("Notebook")},
                    "required": ["type", "notebook"],
                },
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "notebook_deleted"},
                        "name": {"type": "string"},
                    },
                    "required": ["type", "name"],
                },
            ],
        },
    }


def _paths() -> dict[str, Any]:
    job_ref = [JOB_REF]
    return {
        "/jobs": {
            "get": {
                "operationId": "listJobs",
                "summary": "Jobs, newest first",
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "description": "Only jobs in these states (repeat the parameter, or a comma list).",
                        "schema": {
                            "type": "array",
                            "items": {"enum": [str(s) for s in JobState]},
                            "maxItems": 6,
                        },
                        "style": "form",
                        "explode": True,
                    },
                    {"name": "backend", "in": "query", "schema": {"enum": list(BACKENDS)}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 1000,
                            "default": 100,
                        },
                    },
                    {
                        "name": "offset",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 2**62, "default": 0},
                    },
                ],
                "responses": {
                    "200": _json(_ref("JobList"), "A page of jobs"),
                    "400": _error("Invalid query parameter"),
                    "403": FORBIDDEN,
                },
            },
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a job",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("JobSubmission")}},
                },
                "responses": {
                    "201": {
                        **_json(_ref("Job"), "The job, as stored (usually `queued`)"),
                        "headers": {
                            "Location": {
                                "schema": {"type": "string"},
                                "description": "The job's URL",
                            }
                        },
                    },
                    "400": _error("Invalid options or body"),
                    "403": FORBIDDEN,
                    "409": _error(
                        "Valid, but the backend can never run it (e.g. more GPUs than it has)"
                    ),
                    "503": NO_CLUSTER,
                },
            },
        },
        "/jobs/{id}": {
            "parameters": job_ref,
            "get": {
                "operationId": "getJob",
                "responses": {
                    "200": _json(_ref("Job"), "The job"),
                    "403": FORBIDDEN,
                    "404": UNKNOWN_JOB,
                },
            },
            "delete": {
                "operationId": "cancelJob",
                "summary": "Cancel a job (all ranks); with purge, also forget it and its logs",
                "parameters": [
                    {
                        "name": "purge",
                        "in": "query",
                        "schema": {"type": "boolean", "default": False},
                    }
                ],
                "responses": {
                    "200": _json(_ref("Job"), "The job after cancelling (a final state)"),
                    "204": {"description": "Cancelled and forgotten (purge=true)"},
                    "400": _error("Invalid query parameter"),
                    "403": FORBIDDEN,
                    "404": UNKNOWN_JOB,
                },
            },
        },
        "/jobs/{id}/logs": {
            "parameters": job_ref,
            "get": {
                "operationId": "getJobLogs",
                "summary": "Log lines of all ranks (merged by time) or one rank",
                "parameters": [
                    {
                        "name": "rank",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
                    },
                    {
                        "name": "since",
                        "in": "query",
                        "description": "A `cursor` from a previous page: only lines after it.",
                        "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                    },
                    {
                        "name": "tail",
                        "in": "query",
                        "description": "Only the last N lines of each rank (when `since` is not given).",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 100_000},
                    },
                    {
                        "name": "follow",
                        "in": "query",
                        "description": "Stream newline-delimited JSON LogLine objects until the job ends.",
                        "schema": {"type": "boolean", "default": False},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "A page of lines (or, with follow=true, a stream of lines)",
                        "content": {
                            "application/json": {"schema": _ref("LogPage")},
                            "application/x-ndjson": {"schema": _ref("LogLine")},
                        },
                    },
                    "400": _error("Invalid query parameter (e.g. a rank the job does not have)"),
                    "403": FORBIDDEN,
                    "404": UNKNOWN_JOB,
                },
            },
        },
        "/jobs/{id}/metrics": {
            "parameters": job_ref,
            "get": {
                "operationId": "getJobMetrics",
                "summary": "Per-rank CPU/memory/GPU series (the last hour) and current values",
                "parameters": [
                    {
                        "name": "since",
                        "in": "query",
                        "description": "Epoch seconds: only samples after it.",
                        "schema": {"type": "number", "minimum": 0, "maximum": 1e11},
                    }
                ],
                "responses": {
                    "200": _json(_ref("JobMetrics"), "Metrics of every rank"),
                    "400": _error("Invalid query parameter"),
                    "403": FORBIDDEN,
                    "404": UNKNOWN_JOB,
                },
            },
        },
        "/jobs/{id}/result": {
            "parameters": job_ref,
            "get": {
                "operationId": "getJobResult",
                "summary": "The result of a succeeded job, if it has a JSON form",
                "responses": {
                    "200": _json(_ref("JobResult"), "The result"),
                    "403": FORBIDDEN,
                    "404": UNKNOWN_JOB,
                    "409": _error("The job has not succeeded, or its result has no JSON form"),
                },
            },
        },
        "/cluster": {
            "get": {
                "operationId": "getCluster",
                "summary": "Backend, capacity (GPUs/CPUs/memory total and free) and queue",
                "responses": {"200": _json(_ref("Cluster"), "The cluster"), "403": FORBIDDEN},
            }
        },
        "/events": {
            "get": {
                "operationId": "events",
                "summary": "Websocket: a snapshot, then job, cluster and notebook changes as they happen",
                "description": "Each text frame is one JSON Event (see components.schemas.Event). "
                "Job events are coalesced to at most 10 per second per job.",
                "x-websocket": True,
                "responses": {
                    "101": {"description": "Switching to the websocket protocol"},
                    "403": FORBIDDEN,
                    "426": _error("Not a websocket request"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": _json({"type": "object"}, "The OpenAPI document"),
                    "403": FORBIDDEN,
                },
            }
        },
        "/notebooks": {
            "get": {
                "operationId": "listNotebooks",
                "summary": "The calling user's notebook servers",
                "responses": {
                    "200": _json(_ref("NotebookList"), "The user's notebook servers"),
                    "403": FORBIDDEN,
                    "502": API_REFUSED,
                    "503": NO_CLUSTER,
                },
            },
            "post": {
                "operationId": "createNotebook",
                "summary": "Spawn a notebook server owned by the calling user",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("NotebookRequest")}},
                },
                "responses": {
                    "201": {
                        **_json(_ref("Notebook"), "The new notebook server"),
                        "headers": {"Location": {"schema": {"type": "string"}}},
                    },
                    "400": _error("Invalid body"),
                    "403": FORBIDDEN,
                    "409": _error("A notebook server of that name exists"),
                    "502": API_REFUSED,
                    "503": NO_CLUSTER,
                },
            },
        },
        "/notebooks/{name}": {
            "parameters": [NOTEBOOK_REF],
            "get": {
                "operationId": "getNotebook",
                "responses": {
                    "200": _json(_ref("Notebook"), "The notebook server"),
                    "403": FORBIDDEN,
                    "404": _error("The user has no notebook server of that name"),
                    "502": API_REFUSED,
                    "503": NO_CLUSTER,
                },
            },
            "delete": {
                "operationId": "deleteNotebook",
                "responses": {
                    "204": {"description": "Deleted (with everything the controller made for it)"},
                    "403": FORBIDDEN,
                    "404": _error("The user has no notebook server of that name"),
                    "502": API_REFUSED,
                    "503": NO_CLUSTER,
                },
            },
        },
        "/notebooks/{name}/stop": {
            "parameters": [NOTEBOOK_REF],
            "post": {
                "operationId": "stopNotebook",
                "responses": {
                    "200": _json(
                        _ref("Notebook"), "Stopping (annotation mlcluster.io/stopped set)"
                    ),
                    "403": FORBIDDEN,
                    "404": _error("The user has no notebook server of that name"),
                    "502": API_REFUSED,
                    "503": NO_CLUSTER,
                },
            },
        },
        "/notebooks/{name}/start": {
            "parameters": [NOTEBOOK_REF],
            "post": {
                "operationId": "startNotebook",
                "responses": {
                    "200": _json(
                        _ref("Notebook"), "Starting (annotation mlcluster.io/stopped removed)"
                    ),
                    "403": FORBIDDEN,
                    "404": _error("The user has no notebook server of that name"),
                    "502": API_REFUSED,
                    "503": NO_CLUSTER,
                },
            },
        },
    }


def build_document(*, max_workers: int, server_url: str = API_PREFIX) -> dict[str, Any]:
    """The whole OpenAPI document; `server_url` is the API's base (with the server's base_url)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyterlab-mlcluster",
            "version": __version__,
            "description": "Distributed jobs and per-user notebook servers of a Jupyter server. "
            "Authenticate as with every Jupyter API: `Authorization: token <token>`, or the "
            "login cookie plus the `X-XSRFToken` header for requests that change something. "
            "Errors are JSON objects with a `message`.",
        },
        "servers": [{"url": server_url}],
        "security": [{"token": []}],
        "components": {
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "`token <the Jupyter server's token>`",
                }
            },
            "schemas": _schemas(max_workers),
        },
        "paths": _paths(),
    }


# -- validation --------------------------------------------------------------------------


def _ecma_pattern(validator, pattern: str, instance: Any, schema: dict[str, Any]):
    # JSON Schema patterns are ECMA-262, where `$` matches only at the very end; Python's
    # `$` also matches before a trailing newline, which would let "name\n" through.
    if isinstance(instance, str) and not re.search(_python_regex(pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.lru_cache(maxsize=256)
def _python_regex(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


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
        except those every Jupyter API takes (token, _xsrf, no_track_activity)."""
        declared = [p for p in self.parameters(path, method) if p["in"] == "query"]
        unknown = sorted(set(arguments) - {p["name"] for p in declared} - JUPYTER_QUERY_PARAMETERS)
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
        return [*item.get("parameters", []), *item[method].get("parameters", [])]


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
            raise RequestError(f"{name}: must be an integer, got {text!r}") from None
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise RequestError(f"{name}: must be a number, got {text!r}")
        return number
    if kind == "boolean":
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise RequestError(f"{name}: must be true or false, got {text!r}")
    return text


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and error.validator_value is False:
        return error.message.replace("Additional properties are not allowed", "unknown option(s)")
    if error.validator == "oneOf":
        return f"{error.instance!r} is not valid ({error.schema.get('description', 'see the API document')})"
    return error.message
