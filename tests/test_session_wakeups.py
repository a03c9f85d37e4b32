"""A session's supervisor wakes on its FIFO (jobs/sessions.py poke_session): what arrives
there is a hint, never trusted. The FIFO is 0600 in the holder's 0700 directory, so only its
owner can write it; even so, a flood of junk there must not delay the owner's next cell
(the red team's flood of 3,000 ids made it fail after 60 s)."""

from __future__ import annotations

import os

from jupyterlab_mlcluster.jobs import sessions
from jupyterlab_mlcluster.runtime.payload import Payload


def run_cell(service, source: str, **options):
    record, _ = sessions.submit_cell(
        service, "s", options, Payload(kind="code", source=source), origin={"kind": "test"}
    )
    return service.wait(record.id, timeout=60)


def test_a_flood_of_wakeups_does_not_delay_a_cell(service):
    first = run_cell(service, "x = 1", workers=1)
    assert first.state == "succeeded", first.error
    holder = first.origin["session_job"]
    fifo = service.store.job_dir(holder) / sessions.FIFO_NAME
    fd = os.open(fifo, os.O_WRONLY)  # blocks while the supervisor has not read
    try:
        for i in range(3000):  # well-formed ids of no job, and junk
            os.write(fd, f"cell j{i:010x}\ncell ../../{i}\n".encode())
    finally:
        os.close(fd)
    cell = run_cell(service, "x + 1")
    assert cell.state == "succeeded", cell.error
    assert service.result(cell.id) == ("value", 2)
    sessions.stop_session(service, None, "s")
