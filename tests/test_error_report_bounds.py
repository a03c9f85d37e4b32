"""A rank's error report stays readable whatever the exception carries: a pod sends it as one
log line, and its supervisor reads a line up to a limit (a bigger record came out as raw text
in the job's log, and the job lost why the rank failed)."""

from __future__ import annotations

import secrets

from jupyterlab_mlcluster.backends.kubernetes.logs import PodOutput
from jupyterlab_mlcluster.runtime.outcome import MESSAGE_MAX, error_report
from jupyterlab_mlcluster.runtime.protocol import encode_record


def test_an_exception_carrying_megabytes_still_reaches_a_pods_supervisor_as_its_report():
    try:
        raise ValueError("x" * 3_000_000)  # say, a tensor's repr
    except ValueError as exc:
        report = error_report(1, exc)
    key = secrets.token_bytes(32)
    line = encode_record({"type": "error", **report}, key, 1)
    items = list(PodOutput([1], key=key).feed(b"before\n" + line + b"after\n"))
    assert [(kind, value if kind == "line" else value["type"]) for _, kind, value in items] == [
        ("line", "before"),
        ("control", "error"),
        ("line", "after"),
    ]
    message = items[1][2]["message"]
    assert message.startswith("x" * MESSAGE_MAX)
    assert message.endswith(f"({3_000_000 - MESSAGE_MAX} characters more)")
    last = items[1][2]["traceback"].splitlines()[-1]
    assert last.startswith("ValueError: xxx") and last.endswith(" characters more)")
