"""The browser tests' canned API (tests/browser/fake_api.py) answers in the shape of the API
document: a job the real server would never send (a required field missing) once crashed
the job detail in every frontend test, while the panel was fine against the real server."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from jupyterlab_mlcluster.server.openapi import build_document

from .browser.test_grouped_list import grouped_fixture
from .browser.test_sidebar_ui import jobs_fixture, restarted_fixture

SCHEMAS = build_document(max_workers=8)["components"]["schemas"]


def check(schema: str, value: Any) -> None:
    jsonschema.validate(
        value,
        {**SCHEMAS[schema], "components": {"schemas": SCHEMAS}},
        format_checker=jsonschema.FormatChecker(),
    )


@pytest.mark.parametrize("fixture", [jobs_fixture, restarted_fixture, grouped_fixture])
def test_every_canned_job_fits_the_document(fixture):
    fake = fixture()
    assert fake.jobs
    for job in fake.jobs.values():
        check("Job", job)


def test_a_job_missing_a_required_field_is_refused():
    job = next(iter(jobs_fixture().jobs.values()))
    del job["attempts"]
    with pytest.raises(jsonschema.ValidationError, match="'attempts' is a required property"):
        check("Job", job)
