"""%%distributed in a real kernel, with real ranks and torch.distributed (gloo)."""

from __future__ import annotations

import re
import threading
import time

import pytest
from helpers import assert_no_job_processes, run_cli, wait_for
from kernel_session import output_texts, outputs, rank_texts

ALL_REDUCE_CELL = """%%distributed --workers 4 --push x --pull y
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("sum", t.item())
y = t.item() * x
"""


def test_new_kernels_load_the_magics_by_themselves(kernel):
    msgs, reply = kernel.execute("'distributed' in get_ipython().magics_manager.magics['cell']")
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "True"


def test_all_reduce_push_pull_and_rank_output(kernel, service):
    kernel.execute("x = 3")
    msgs, reply = kernel.execute(ALL_REDUCE_CELL)
    assert reply["status"] == "ok", reply
    msgs2, _ = kernel.execute("y")
    assert outputs(msgs2, "execute_result")[0]["data"]["text/plain"] == "30.0"
    texts = rank_texts(msgs)
    assert texts == {r: f"[rank {r}] sum 10.0" for r in range(4)}
    # one output per rank, not one per line
    rank_displays = [
        m
        for m in msgs
        if m["msg_type"] == "display_data"
        and "mlcluster-rank-" in m["content"].get("transient", {}).get("display_id", "")
    ]
    assert len(rank_displays) == 4
    (record,) = service.store.list_jobs()[0]
    assert record.state == "succeeded" and record.origin["kind"] == "kernel"


def test_last_expression_of_rank0_is_the_cell_value(kernel):
    msgs, reply = kernel.execute(
        "%%distributed --workers 2\nimport os\n{'rank': int(os.environ['RANK']), 'world': int(os.environ['WORLD_SIZE'])}"
    )
    assert reply["status"] == "ok"
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "{'rank': 0, 'world': 2}"


def test_functions_and_classes_defined_in_the_notebook_can_be_pushed(kernel):
    kernel.execute(
        "class Scale:\n    def __init__(self, k): self.k = k\n    def __call__(self, v): return v * self.k\n\ndef make(k):\n    return Scale(k)\n"
    )
    msgs, reply = kernel.execute(
        "%%distributed --workers 2 --push make\nimport os\nmake(10)(int(os.environ['RANK']) + 1)"
    )
    assert reply["status"] == "ok", reply
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "10"


def test_failing_rank_raises_with_its_traceback(kernel, service):
    cell = "%%distributed --workers 3\nimport os, time\nif os.environ['RANK'] == '1':\n    1 / 0\ntime.sleep(60)\n"
    started = time.monotonic()
    msgs, reply = kernel.execute(cell)
    assert time.monotonic() - started < 30
    assert reply["status"] == "error"
    assert "rank 1 failed: ZeroDivisionError: division by zero" in reply["evalue"]
    (error,) = outputs(msgs, "error")
    text = "\n".join(error["traceback"])
    assert "Traceback of rank 1" in text and "1 / 0" in text
    # The notebook's line number: it counts the %%distributed line (before: line 3).
    assert ", line 4, in <module>" in text and ", line 3," not in text
    # Our notice about the job is not under a rank's prefix (before: [rank 0] [mlcluster] ...).
    shown = "\n".join(output_texts(msgs)).splitlines()
    assert "[mlcluster] stopping (a rank failed): SIGTERM, then SIGKILL after 30 s" in shown
    assert not [line for line in shown if re.match(r"\[rank \d\] \[mlcluster\]", line)], shown
    # Printed under the name of the class the user would catch (one name, not two).
    assert reply["ename"] == "DistributedJobFailed"
    assert text.startswith("\x1b[31mDistributedJobFailed\x1b[0m: ")
    assert "magics.py" not in text  # our machinery stays out of the user's way
    assert_no_job_processes(service)


def test_interrupt_cancels_the_job_and_leaves_nothing(kernel, service):
    msg_id = kernel.kc.execute(
        "%%distributed --workers 2\nimport time\nprint('up', flush=True)\ntime.sleep(300)"
    )
    job = wait_for(
        lambda: [
            j for j in service.store.list_jobs()[0] if all(r.state == "running" for r in j.ranks)
        ],
        timeout=60,
    )[0]
    kernel.km.interrupt_kernel()
    msgs, reply = kernel.collect(msg_id, timeout=60)
    # As an interrupted Python cell ends: KeyboardInterrupt, not asyncio's CancelledError
    # (the cell is awaited under autoawait), and none of our frames in its traceback.
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    (error,) = outputs(msgs, "error")
    text = "\n".join(error["traceback"])
    assert "CancelledError" not in text and "magics.py" not in text, text
    assert f"job {job.id} was cancelled" in text
    record = service.store.get_job(job.id)
    assert record.state == "cancelled"
    assert_no_job_processes(service)
    # the kernel is still usable
    msgs, reply = kernel.execute("1 + 1")
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "2"


def test_what_ranks_print_while_stopping_reaches_the_interrupted_cell(kernel, service):
    """Interrupting the kernel sends SIGTERM to every rank (torchrun's way of stopping them);
    a handler that saves a checkpoint gets its time, and its last words reach the cell."""
    msg_id = kernel.kc.execute(
        "%%distributed --workers 2\n"
        "import os, signal, sys, time\n"
        "def save(signum, frame):\n"
        "    print('saving a checkpoint', flush=True)\n"
        "    time.sleep(1)\n"
        "    print('checkpoint saved', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "print('training', flush=True)\n"
        "time.sleep(300)\n"
    )
    job = wait_for(
        lambda: [j for j in service.store.list_jobs()[0] if len(service.logs(j.id)[0]) == 2],
        timeout=60,
    )[0]
    kernel.km.interrupt_kernel()
    msgs, reply = kernel.collect(msg_id, timeout=60)
    assert reply["ename"] == "KeyboardInterrupt", reply
    texts = rank_texts(msgs)
    for rank in (0, 1):
        assert "checkpoint saved" in texts[rank], texts
    record = service.store.get_job(job.id)
    assert record.state == "cancelled"
    assert record.reason.startswith("cancelled by user (kernel interrupt); rank")  # ...; where


@pytest.mark.parametrize(
    "cell,message",
    [
        ("%%distributed --wrokers 2\npass", "unrecognized arguments: --wrokers"),
        ("%%distributed --workers 0\npass", "workers must be at least 1"),
        ("%%distributed --memory lots\npass", "memory must be a size"),
        ("%%distributed --push nothere\npass", "--push nothere: name 'nothere' is not defined"),
        ("%%distributed --push lock\npass", "--push lock: cannot send lock to the ranks"),
        ("%%distributed --gpus-per-worker 1\npass", "needs 1 GPUs"),
        ("%%distributed --workers 2\ndef broken(:\n    pass", "the cell does not compile"),
        ("%%distributed --pull 1x\npass", "--pull 1x: not a Python variable name"),
    ],
)
def test_bad_options_submit_nothing(kernel, service, cell, message):
    kernel.execute("import threading\nlock = threading.Lock()")
    msgs, reply = kernel.execute(cell)
    assert reply["status"] == "error"
    assert reply["ename"] == "UsageError"
    assert message in reply["evalue"], reply["evalue"]
    assert service.store.list_jobs()[1] == 0


def test_widget_messages_carry_rank_state_and_progress(kernel):
    cell = (
        "%%distributed --workers 2\n"
        "import os, time, jupyterlab_mlcluster as mlc\n"
        "from tqdm import tqdm\n"
        "if os.environ['RANK'] == '0':\n"
        "    for i in tqdm(range(20), desc='epoch'):\n"
        "        time.sleep(0.05)\n"
        "else:\n"
        "    for step in range(1, 11):\n"
        "        mlc.progress(step, 10, desc='eval')\n"
        "        time.sleep(0.1)\n"
    )
    # Each rank's last report is in the monitor's final drawing whatever the machine's
    # pace (one rank's tqdm, the other's mlc.progress), so no label can be missed.
    msgs, reply = kernel.execute(cell)
    assert reply["status"] == "ok", reply
    states = set()
    labels = set()
    for m in msgs:
        if m["msg_type"] != "comm_msg":
            continue
        value = m["content"]["data"].get("state", {}).get("value", "")
        states.update(re.findall(r"data-rank='(\d)' data-state='(\w+)'", value))
        labels.update(re.findall(r"(epoch \d+/20|eval \d+/10)", value))
    assert {("0", "running"), ("1", "running"), ("0", "succeeded"), ("1", "succeeded")} <= states
    assert {"eval 10/10", "epoch 20/20"} <= labels, labels


def test_a_pulled_result_is_private_and_leaves_the_store_once_delivered(kernel, service):
    msgs, reply = kernel.execute(
        "%%distributed --workers 2 --no-wait --pull blob\nblob = b'x' * 1_000_000\n"
    )
    assert reply["status"] == "ok", reply
    (record,) = service.store.list_jobs()[0]
    assert service.wait(record.id, timeout=60).state == "succeeded"
    path = service.store.result_path(record.id)
    assert service.store.get_job(record.id).has_result
    assert path.stat().st_mode & 0o777 == 0o600  # only its owner may read it meanwhile
    msgs, reply = kernel.execute(f"%distributed_attach {record.id}\nlen(blob)")
    assert reply["status"] == "ok", reply
    msgs, _ = kernel.execute("len(blob)")
    assert outputs(msgs, "execute_result")[0]["data"]["text/plain"] == "1000000"
    # delivered: the store keeps no copy, and says so
    assert not path.exists() and not list(path.parent.glob("result.*"))
    assert not service.store.get_job(record.id).has_result


def test_no_wait_returns_a_handle_and_jobs_are_listed(kernel, service, tmp_path):
    # The ranks wait for a file the test makes only once the cell has returned: the cell
    # cannot have waited for the job (no clock to race on a loaded machine).
    go = tmp_path / "go"
    msgs, reply = kernel.execute("job = None\n")
    msgs, reply = kernel.execute(
        "%%distributed --workers 2 --no-wait --name bg\nimport os, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done')"
    )
    assert reply["status"] == "ok", reply
    text = outputs(msgs, "execute_result")[0]["data"]["text/plain"]
    job_id = re.search(r"<Job (j[0-9a-f]+) 'bg'", text).group(1)
    assert not service.store.get_job(job_id).state.final
    go.touch()
    assert service.wait(job_id, timeout=60).state == "succeeded"
    msgs, reply = kernel.execute("%distributed_jobs")
    table = outputs(msgs, "display_data")[0]["data"]
    assert (
        job_id in table["text/plain"]
        and "succeeded" in table["text/plain"]
        and job_id in table["text/html"]
    )
    msgs, reply = kernel.execute(f"%distributed_logs {job_id} --rank 1")
    assert "[rank 1] done" in "".join(c["text"] for c in outputs(msgs, "stream"))


def test_distributed_jobs_groups_cells_and_trials_as_mlcluster_jobs_does(kernel, store_dir):
    """%distributed_jobs lists a session's cells under the session and a sweep's trials under
    the sweep (the CLI's grouping, jobs/listing.py); --flat every row, --parent one group."""
    from test_grouping import SESSION, SWEEP, fill

    from jupyterlab_mlcluster.jobs.storage.store import JobStore

    store = JobStore(store_dir)
    fill(store)  # a plain job, a session with 12 cells, a sweep of 3 trials
    store.close()
    msgs, _ = kernel.execute("%distributed_jobs")
    (table,) = [m["data"] for m in outputs(msgs, "display_data")]
    lines = table["text/plain"].splitlines()
    assert len(lines) == 1 + 4 + 7 + 1, lines  # header; sweep, 3 trials; session, 5, "more"; plain
    assert lines[1].startswith(SWEEP) and lines[2].startswith("  j0000000t002")
    assert "7 more cells" in table["text/plain"]
    assert f"%distributed_jobs --parent {SESSION}" in table["text/plain"]
    assert table["text/html"].count("padding-left") == 3 + 5 + 1 and SWEEP in table["text/html"]
    msgs, _ = kernel.execute("%distributed_jobs --flat --limit 100")
    (flat,) = [m["data"] for m in outputs(msgs, "display_data")]
    assert (
        len(flat["text/plain"].splitlines()) == 1 + 17 and "padding-left" not in flat["text/html"]
    )
    msgs, _ = kernel.execute(f"%distributed_jobs --parent {SESSION} --limit 3")
    (under,) = [m["data"] for m in outputs(msgs, "display_data")]
    assert [line.split()[1] for line in under["text/plain"].splitlines()[1:4]] == [
        "train-cell13",
        "train-cell12",
        "train-cell11",
    ]


def test_cancel_button_stops_the_job(kernel, service):
    button = {}

    def watch(msg):
        if msg["msg_type"] == "comm_open":
            state = msg["content"]["data"].get("state", {})
            if state.get("_model_name") == "ButtonModel" and state.get("description") == "Cancel":
                button["comm_id"] = msg["content"]["comm_id"]

    msg_id = kernel.kc.execute("%%distributed --workers 2\nimport time\ntime.sleep(300)")
    collected = {}

    def collect():
        collected["result"] = kernel.collect(msg_id, timeout=120, on_msg=watch)

    thread = threading.Thread(target=collect)
    thread.start()
    wait_for(
        lambda: (
            button.get("comm_id")
            and [j for j in service.store.list_jobs()[0] if j.state == "running"]
        ),
        timeout=60,
    )
    # what the browser sends when the button is clicked
    kernel.kc.shell_channel.send(
        kernel.kc.session.msg(
            "comm_msg",
            {
                "comm_id": button["comm_id"],
                "data": {"method": "custom", "content": {"event": "click"}},
            },
        )
    )
    thread.join(60)
    msgs, reply = collected["result"]
    assert reply["status"] == "error" and "cancelled by user" in reply["evalue"]
    (record,) = service.store.list_jobs()[0]
    assert record.state == "cancelled"
    assert_no_job_processes(service)


def test_attach_to_a_job_submitted_elsewhere(kernel, service, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.5)\n"
    )
    job_id = run_cli("run", "--no-wait", "--workers", "2", str(script)).stdout.strip()
    msgs, reply = kernel.execute(f"%distributed_attach {job_id}")
    assert reply["status"] == "ok"
    assert rank_texts(msgs)[1] == "[rank 1] tick 0\n[rank 1] tick 1\n[rank 1] tick 2"
    msgs, reply = kernel.execute(f"%distributed_cancel {job_id}")
    assert f"{job_id} succeeded" in "".join(c["text"] for c in outputs(msgs, "stream"))


def test_fast_printing_is_coalesced(kernel):
    cell = "%%distributed --workers 2\nfor i in range(20000):\n    print(i)\n"
    started = time.monotonic()
    msgs, reply = kernel.execute(cell)
    duration = time.monotonic() - started
    assert reply["status"] == "ok"
    updates = [m for m in msgs if m["msg_type"] == "update_display_data"]
    assert len(updates) <= 2 * (duration * 10 + 5), f"{len(updates)} updates in {duration:.1f}s"
    text = rank_texts(msgs)[0].splitlines()
    assert text[-1] == "[rank 0] 19999"
    assert "earlier lines: %distributed_logs" in text[0]


@pytest.mark.slow
def test_quickstart_notebook_runs_headless(store_dir):
    """The README's demo: nbclient executes examples/quickstart.ipynb in a real kernel."""
    import subprocess
    import sys

    from helpers import REPO

    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "run_notebook.py"),
            str(REPO / "examples" / "quickstart.ipynb"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "mlcluster job quickstart-ddp" in out and "succeeded" in out  # text/plain of the monitor
    first, last = map(
        float, re.search(r"mean loss over 4 ranks: ([\d.]+) -> ([\d.]+)", out).groups()
    )
    assert last < first / 5, "the model did not train"
    for rank in range(4):
        assert f"[rank {rank}] epoch   0" in out
    # its session cells: the second training cell goes on from the first one's state
    first, second = map(float, re.findall(r"\[rank 0\] step (?:20|40): loss ([\d.]+)", out))
    assert "[rank 3] step 40: loss" in out and second < first
    assert "session quickstart stopped (cancelled)" in out


@pytest.mark.slow
def test_terminal_ipython_degrades_to_plain_lines(store_dir, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "job.ipy"
    script.write_text(
        "%%distributed --workers 2\nimport os\nprint('hello from', os.environ['RANK'])\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "IPython",
            "--no-banner",
            "--colors=NoColor",
            "--ext",
            "jupyterlab_mlcluster",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] hello from 0" in proc.stdout and "[rank 1] hello from 1" in proc.stdout
    # No notebook: an unnamed job is named after its cell's number.
    assert re.search(r"mlcluster job cell\d+ \(j[0-9a-f]+\) succeeded", proc.stdout)
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_quick_job_leaves_a_plain_summary_and_a_long_one_gets_widgets(kernel):
    # Under WIDGET_DELAY: no widgets at all (their ~20 ms of kernel CPU would compete with
    # the ranks starting); the display ends as plain HTML with each rank's final state.
    # The threshold is raised for this half so a loaded machine can't make the "quick" job
    # outlast it, and restored to the product's value for the long half.
    _, reply = kernel.execute(
        "import jupyterlab_mlcluster.kernel.cell_run as _m\n"
        "_product_delay = _m.WIDGET_DELAY\n_m.WIDGET_DELAY = 60.0"
    )
    assert reply["status"] == "ok"
    msgs, reply = kernel.execute("%%distributed --workers 2\nprint('hi')")
    assert reply["status"] == "ok"
    assert not [m for m in msgs if m["msg_type"] == "comm_open"]
    displays = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    final = [m["content"]["data"] for m in displays if "text/html" in m["content"]["data"]][-1]
    assert "mlcluster-summary" in final["text/html"] and "succeeded" in final["text/plain"]
    assert sorted(re.findall(r"data-rank='(\d)' data-state='(\w+)'", final["text/html"])) == [
        ("0", "succeeded"),
        ("1", "succeeded"),
    ]
    # A job still running after WIDGET_DELAY swaps the summary for the live widgets.
    _, reply = kernel.execute("_m.WIDGET_DELAY = _product_delay")
    assert reply["status"] == "ok"
    msgs, reply = kernel.execute("%%distributed --workers 2\nimport time\ntime.sleep(1.5)")
    assert reply["status"] == "ok"
    models = [
        m["content"]["data"]["state"].get("_model_name")
        for m in msgs
        if m["msg_type"] == "comm_open"
    ]
    assert "ButtonModel" in models and "TabModel" in models
    swapped = [
        m
        for m in msgs
        if m["msg_type"] == "update_display_data"
        and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]
    ]
    assert swapped, "the display was never switched to the widgets"
