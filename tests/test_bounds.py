"""Every number a job takes is bounded, the same bounds as the REST document's, and an
out-of-range one is a clear error naming the option and its range that changes nothing:
from the model, the Python API's submit(), `mlcluster run` and the magic's option parser."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli

from jupyterlab_mlcluster import bounds
from jupyterlab_mlcluster.jobs.model import JobSpec, SpecError
from jupyterlab_mlcluster.runtime.payload import Payload

# (option, a value out of its range as a user types it, what the message must say)
OUT_OF_RANGE = [
    ("workers", "0", "at least 1 and at most 65536"),
    ("workers", "65537", "at least 1 and at most 65536"),
    ("workers", "9" * 400, "at least 1 and at most 65536"),
    ("gpus_per_worker", "-1", "at least 0 and at most 1024"),
    ("gpus_per_worker", "1025", "at least 0 and at most 1024"),
    ("cpus", "0", "greater than 0 and at most 1000000"),
    ("cpus", "1000001", "greater than 0 and at most 1000000"),
    ("cpus", "1e400", "greater than 0 and at most 1000000"),
    ("memory", "9" * 400, "at least 1 byte and at most 4Ei (4611686018427387904 bytes)"),
    ("memory", "5Ei", "at least 1 byte and at most 4Ei"),
    ("memory", "0.5", "at least 1 byte"),
    ("timeout", "9" * 400, "greater than 0 and at most 1000000000 seconds"),
    ("timeout", "1000000001", "greater than 0 and at most 1000000000 seconds"),
    ("max_restarts", "-1", "at least 0 and at most 1000"),
    ("max_restarts", "1001", "at least 0 and at most 1000"),
    ("priority", "99999999999999999999", "at least -2147483648 and at most 2147483647"),
    ("priority", "-2147483649", "at least -2147483648 and at most 2147483647"),
]

# The same, as Python values (what the Python API and REST JSON carry).
OUT_OF_RANGE_VALUES = [
    ("workers", 10**6),
    ("gpus_per_worker", 10**400),
    ("cpus", 10**400),
    ("cpus", float("nan")),
    ("memory", 10**400),
    ("memory", 0),
    ("timeout", float("inf")),
    ("max_restarts", 2**63),
    ("priority", 10**20),
    ("priority", -(2**31) - 1),
]


def ids(cases):
    return [f"{case[0]}={str(case[1])[:12]}" for case in cases]


@pytest.mark.parametrize("option,value,range_text", OUT_OF_RANGE, ids=ids(OUT_OF_RANGE))
def test_the_model_names_the_option_and_its_range(option, value, range_text):
    with pytest.raises(SpecError) as caught:
        JobSpec.from_options({option: value})
    message = str(caught.value)
    assert message.startswith(f"{option} must be"), message
    assert range_text in message, message
    assert len(message) < 200, "a 400-digit value is not echoed whole"


@pytest.mark.parametrize("option,value", OUT_OF_RANGE_VALUES, ids=ids(OUT_OF_RANGE_VALUES))
def test_python_values_out_of_range_are_spec_errors(option, value):
    with pytest.raises(SpecError, match=f"^{option} must be"):
        JobSpec.from_options({option: value})


def test_the_edges_of_every_range_are_accepted():
    low = JobSpec.from_options(
        {
            "workers": bounds.WORKERS.minimum,
            "gpus_per_worker": 0,
            "cpus": "0.001",
            "memory": 1,
            "timeout": "0.5",
            "max_restarts": 0,
            "priority": str(bounds.PRIORITY.minimum),
        }
    )
    high = JobSpec.from_options(
        {
            "workers": str(bounds.WORKERS.maximum),
            "gpus_per_worker": bounds.GPUS_PER_WORKER.maximum,
            "cpus": bounds.CPUS.maximum,
            "memory": "4Ei",
            "timeout": "1000000000",
            "max_restarts": "1000",
            "priority": "2147483647",
        }
    )
    assert (low.workers, low.memory, low.priority) == (1, 1, -(2**31))
    assert (high.workers, high.memory, high.timeout, high.priority) == (
        65536,
        2**62,
        1e9,
        2**31 - 1,
    )


def assert_store_unchanged(store_dir, service=None):
    jobs = store_dir / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir()), "no job directory was written"
    if service is not None:
        assert service.store.list_jobs()[1] == 0, "no job row"


@pytest.mark.parametrize("option,value", OUT_OF_RANGE_VALUES, ids=ids(OUT_OF_RANGE_VALUES))
def test_submit_refuses_a_spec_built_in_python_before_writing_anything(
    service, store_dir, option, value
):
    """JobSpec(...) skips from_options: submit() checks it before the job row, directory and
    payload (priority 10**20 used to overflow SQLite after those were written)."""
    spec = JobSpec(**{option: value})
    with pytest.raises(SpecError, match=f"^{option} must be"):
        service.submit(spec, Payload(source="pass"))
    assert_store_unchanged(store_dir, service)


@pytest.mark.slow
def test_mlcluster_run_refuses_out_of_range_options_and_stores_nothing(store_dir, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass")
    for option, value, range_text in OUT_OF_RANGE:
        flag = "--" + option.replace("_", "-")
        proc = run_cli("run", f"{flag}={value}", str(script))
        assert proc.returncode == 2, (option, proc.stderr)
        assert f"{option} must be" in proc.stderr and range_text in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr
        assert_store_unchanged(store_dir)
    assert json.loads(run_cli("jobs", "--json").stdout) == []


@pytest.mark.parametrize("option,value,range_text", OUT_OF_RANGE, ids=ids(OUT_OF_RANGE))
def test_the_magics_option_parser_refuses_out_of_range_options(option, value, range_text):
    """The magic turns this SpecError into a UsageError before it touches the service."""
    from IPython.core import magic_arguments

    from jupyterlab_mlcluster.jobs.options import spec_from_args
    from jupyterlab_mlcluster.kernel.magics import DistributedMagics

    flag = "--" + option.replace("_", "-")
    args = magic_arguments.parse_argstring(DistributedMagics.distributed, f"{flag}={value}")
    with pytest.raises(SpecError) as caught:
        spec_from_args(args)
    assert str(caught.value).startswith(f"{option} must be")
    assert range_text in str(caught.value)
