"""The API document as a static file: valid OpenAPI 3.1 as shipped and as served, its shared
patterns and enums the same as the Python code's, and nothing left to fill in."""

from __future__ import annotations

import json

import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from jupyterlab_mlcluster import bounds, patterns
from jupyterlab_mlcluster._version import __version__
from jupyterlab_mlcluster.jobs.model import (
    BACKENDS,
    FRAMEWORKS,
    RESERVED_ENV,
    JobSpec,
    JobState,
    RankState,
    SpecError,
)
from jupyterlab_mlcluster.server.openapi import build_document, static_document


def all_values(node, key):
    """Every value of `key` anywhere in a JSON-like tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from all_values(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from all_values(v, key)


def test_the_shipped_file_is_valid_openapi():
    validate(static_document())


def test_the_served_document_is_valid_openapi_with_its_runtime_values():
    document = build_document(max_workers=7, server_url="/base/mlcluster/api")
    validate(document)
    assert document["info"]["version"] == __version__
    assert document["servers"] == [{"url": "/base/mlcluster/api"}]
    workers = document["components"]["schemas"]["JobSubmission"]["properties"]["workers"]
    assert workers["maximum"] == 7
    assert not list(all_values(document, "x-pattern")), "every x-pattern is filled in"
    assert json.loads(json.dumps(document, allow_nan=False)) == document, "plain JSON"


def test_the_validator_really_checks():
    """The check above can fail: a response without its required description is refused."""
    document = build_document(max_workers=1)
    del document["paths"]["/jobs/{id}"]["get"]["responses"]["200"]["description"]
    with pytest.raises(OpenAPIValidationError):
        validate(document)


def test_shared_patterns_come_from_the_patterns_module():
    names = list(all_values(static_document(), "x-pattern"))
    assert set(names) <= set(patterns.BY_NAME), "every x-pattern names a shared pattern"
    assert {"job_name", "job_ref", "notebook_name", "cpu_quantity", "memory_quantity"} <= set(names)
    document = build_document(max_workers=1)
    schemas = document["components"]["schemas"]
    assert schemas["JobSubmission"]["properties"]["name"]["pattern"] == patterns.JOB_NAME
    assert schemas["NotebookRequest"]["properties"]["cpu"]["pattern"] == patterns.CPU_QUANTITY
    job_ref = document["components"]["parameters"]["JobRef"]["schema"]["pattern"]
    assert job_ref == patterns.JOB_REF
    # No copy of a shared pattern typed into the file by hand.
    assert not set(all_values(static_document(), "pattern")) & set(patterns.BY_NAME.values())


def test_unknown_x_pattern_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(patterns.BY_NAME, "job_name")
    with pytest.raises(ValueError, match="unknown x-pattern 'job_name'"):
        build_document(max_workers=1)


def numeric_schema(prop):
    """The number branch of a property's schema (memory and timeout also take strings)."""
    for branch in prop.get("oneOf", [prop]):
        if branch.get("type") in ("integer", "number"):
            return branch
    return None


def test_the_job_options_numeric_bounds_are_the_models():
    document = build_document(max_workers=bounds.WORKERS.maximum + 10)
    properties = document["components"]["schemas"]["JobSubmission"]["properties"]
    numeric = {name: numeric_schema(p) for name, p in properties.items() if numeric_schema(p)}
    assert set(numeric) == set(bounds.BY_NAME), "every number of a job has one shared bound"
    for name, schema in numeric.items():
        bound = bounds.BY_NAME[name]
        low = "exclusiveMinimum" if bound.exclusive_minimum else "minimum"
        assert (schema[low], schema["maximum"]) == (bound.minimum, bound.maximum), name
        assert not ({"minimum", "exclusiveMinimum"} - {low}) & set(schema), name
        # ...and the model holds to the same numbers: the edges pass, one past them fails.
        JobSpec.from_options({name: schema["maximum"]})
        with pytest.raises(SpecError, match=f"^{name} must be"):
            JobSpec.from_options({name: schema["maximum"] + 1})
        below = schema[low] if bound.exclusive_minimum else schema[low] - 1
        with pytest.raises(SpecError, match=f"^{name} must be"):
            JobSpec.from_options({name: below})
        if not bound.exclusive_minimum:
            JobSpec.from_options({name: schema[low]})
    # No bound typed into the file by hand, where it could drift from the model's.
    static = static_document()["components"]["schemas"]["JobSubmission"]["properties"]
    for name in numeric:
        hand = numeric_schema(static[name])
        assert not {"minimum", "exclusiveMinimum", "maximum"} & set(hand), name
    # A server allowing fewer ranks says its own limit.
    small = build_document(max_workers=8)["components"]["schemas"]["JobSubmission"]
    assert small["properties"]["workers"]["maximum"] == 8


def test_unknown_x_bounds_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(bounds.BY_NAME, "priority")
    with pytest.raises(ValueError, match="unknown x-bounds 'priority'"):
        build_document(max_workers=1)


def test_enums_are_the_models():
    schemas = static_document()["components"]["schemas"]
    assert schemas["JobState"]["enum"] == [s.value for s in JobState]
    assert schemas["Rank"]["properties"]["state"]["enum"] == [s.value for s in RankState]
    assert schemas["Backend"]["enum"] == list(BACKENDS)
    assert schemas["Framework"]["enum"] == list(FRAMEWORKS)
    env_names = schemas["JobSubmission"]["properties"]["env"]["propertyNames"]
    assert env_names["not"]["enum"] == sorted(RESERVED_ENV)


def test_the_shared_enums_are_named_once_and_referred_to():
    """Every state, backend and framework of the document is the one named schema, so the
    model's enums are checked in one place and no copy can drift."""
    document = static_document()
    schemas = document["components"]["schemas"]

    def ref(name: str) -> dict[str, str]:
        return {"$ref": f"#/components/schemas/{name}"}

    assert schemas["Job"]["properties"]["state"] == ref("JobState")
    assert schemas["Trial"]["properties"]["state"] == ref("JobState")
    for name in ("JobSubmission", "Job", "Cluster", "Schedule"):
        assert schemas[name]["properties"]["backend"] == ref("Backend"), name
    for name in ("JobSubmission", "Job"):
        assert schemas[name]["properties"]["framework"] == ref("Framework"), name
    list_jobs = document["paths"]["/jobs"]["get"]["parameters"]
    assert list_jobs[0]["schema"]["items"] == ref("JobState")
    assert list_jobs[1]["schema"] == ref("Backend")
    shared = [schemas[name]["enum"] for name in ("JobState", "Backend", "Framework")]
    copies = [enum for enum in all_values(document, "enum") if enum in shared]
    assert copies == shared, copies  # the three named schemas themselves, no inline copy


def test_every_rest_operation_documents_the_refusals_jupyter_server_makes_before_it():
    """403 (authentication, authorization, Host check) and 404 (a cross-origin request
    Jupyter Server blocks) can come from any REST route, whatever its handler does."""
    for path, item in static_document()["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            assert "403" in operation["responses"], (method, path)
            if not operation.get("x-websocket"):
                assert "404" in operation["responses"], (method, path)
