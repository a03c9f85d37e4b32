"""What `submit()` sends from modules beside the notebook (issue 30, 3): a function, a class
and an object of a module on the caller's sys.path travel by reference (cloudpickle pickles
an importable module's objects so), and the rank imports that module only once it has the
caller's sys.path and working directory. What cannot be loaded says what and why, in the
error the caller sees. Driven as a user would: a Python process started in the directory
of its own modules, calling `jupyterlab_mlcluster.submit`; warm ranks and cold ones."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

HELPERS = """\
import os


class Box:
    def __init__(self, value):
        self.value = value


def train(box, scale=1):
    return Box((int(os.environ["RANK"]), box.value * scale))
"""

CALLER = """\
import json, sys
import jupyterlab_mlcluster as mlc
{imports}
job = mlc.submit({call})
try:
    job.wait()
    value = job.result
    print(json.dumps({{"ok": [type(value).__module__, list(value.value)]}}))
except Exception as exc:
    print(json.dumps({{"error": str(exc), "type": type(exc).__name__}}))
"""


def _caller(directory, imports: str, call: str) -> dict:
    script = directory / "caller.py"
    script.write_text(CALLER.format(imports=textwrap.dedent(imports), call=call))
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_function_class_and_object_from_a_module_beside_the_caller_run_on_the_ranks(
    service, tmp_path, pool_mode
):
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    (notebook / "helpers.py").write_text(HELPERS)
    answer = _caller(
        notebook,
        "import helpers",
        "helpers.train, 2, args=(helpers.Box(21),), kwargs={'scale': 2}",
    )
    # Rank 0's return value, an object of the caller's module, came back as one.
    assert answer == {"ok": ["helpers", [0, 42]]}, answer
    (record,) = service.store.list_jobs()[0]
    assert record.state == "succeeded"
    assert [r.state for r in record.ranks] == ["succeeded", "succeeded"]


def test_pushed_objects_of_a_module_beside_the_caller_load_in_the_cell(
    service, tmp_path, pool_mode
):
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    (notebook / "helpers.py").write_text(HELPERS)
    answer = _caller(
        notebook,
        "import helpers",
        "'import helpers\\nhelpers.train(box)', 2, push={'box': helpers.Box(5)}",
    )
    assert answer == {"ok": ["helpers", [0, 5]]}, answer


def test_what_the_rank_cannot_load_is_named_in_the_callers_error(service, tmp_path, pool_mode):
    """A module the caller loaded from a file that is on no sys.path of the rank: the job
    fails saying what could not be loaded (the function, its arguments), the module, and
    where the rank looked; no frames of ours. Before: "rank 0 exited with status 1"."""
    away = tmp_path / "elsewhere"
    away.mkdir()
    (away / "faraway.py").write_text(HELPERS)
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    answer = _caller(
        notebook,
        f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("faraway", {str(away / "faraway.py")!r})
        faraway = importlib.util.module_from_spec(spec)
        sys.modules["faraway"] = faraway
        spec.loader.exec_module(faraway)
        """,
        "faraway.train, 2, args=(faraway.Box(1),)",
    )
    assert answer.get("type") == "DistributedJobFailed", answer
    error = answer["error"]
    assert re.match(
        r"rank [01] failed: PayloadError: cannot load the function faraway\.train", error
    )
    assert "arguments (Box)" in error
    assert "ModuleNotFoundError: No module named 'faraway'" in error
    assert f"the rank's working directory: {notebook}" in error
    assert "jupyterlab_mlcluster/runtime" not in error  # no frames of ours
    (record,) = service.store.list_jobs()[0]
    report = service.error_report(record.id)
    assert report["exc_type"] == "PayloadError"
    assert "Traceback" not in report["traceback"], report["traceback"]
