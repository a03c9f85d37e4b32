"""`%%distributed --session NAME --backend kubernetes` in a real kernel, against the API
emulator, with the player running the pods' ranks for real: the magic, its live output and
result, a kernel interrupt (KeyboardInterrupt in every rank's code, the session kept), and
`%distributed_session list | stop` work on this backend as locally. pdb on a pod's rank
(issue 33 item 4): `breakpoint()` pauses it, its prompt the kernel's input request (the pod
shares no files with the kernel: the supervisor mirrors the prompt over the session's
channel), and `%distributed_debug` opens a post-mortem; the session is kept."""

from __future__ import annotations

import os

import pytest
from helpers import start_kernel, wait_for
from kernel_session import KernelSession, outputs, rank_texts

from tests.kube.player import objects_of

pytestmark = pytest.mark.slow


@pytest.fixture
def kernel(store_dir):
    km, kc = start_kernel(kernel_name="python3", env=dict(os.environ))  # $KUBECONFIG: the emulator
    try:
        yield KernelSession(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _value(msgs) -> str:
    return outputs(msgs, "execute_result")[0]["data"]["text/plain"]


def _cells(service):
    return sorted(
        (j for j in service.store.list_jobs()[0] if j.origin.get("session_job")),
        key=lambda j: j.created,
    )


def test_a_kernel_runs_cells_in_a_kubernetes_session(k8s, player, kernel, kube, kube_namespace):
    service = k8s()
    kernel.execute("x = 20")
    msg_id = kernel.kc.execute(
        "%%distributed --session llm --backend kubernetes --workers 2 --push x\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "y = torch.tensor([float(x + dist.get_rank())])\n"
        "print('rank', dist.get_rank(), 'ready', flush=True)\n"
    )
    holder = wait_for(
        lambda: [
            j
            for j in service.store.list_jobs()[0]
            if j.origin.get("session") and not j.origin.get("session_job")
        ],
        timeout=60,
        message="the session's holder job",
    )[0]
    job = player.resumed(holder.id)
    runs = {}
    for rank, pod in player.create_pods(job).items():
        player.schedule(pod)
        runs[rank] = player.run_rank(pod, pod_ip="127.0.0.1")
        player.end_when_exited(runs[rank])
    msgs, reply = kernel.collect(msg_id, timeout=120)
    assert reply["status"] == "ok", (reply, [r.text for r in runs.values()])
    assert rank_texts(msgs) == {0: "[rank 0] rank 0 ready", 1: "[rank 1] rank 1 ready"}

    # The next cell runs on the same live ranks: `y` and the process group are still there.
    msgs, reply = kernel.execute(
        "%%distributed --session llm\ndist.all_reduce(y)\nfloat(y[0])\n", timeout=120
    )
    assert reply["status"] == "ok", reply
    assert _value(msgs) == "41.0"

    # Ctrl-C: KeyboardInterrupt in every rank's code; the session and its state stay.
    msg_id = kernel.kc.execute(
        "%%distributed --session llm\n"
        "import time\n"
        "caught = 0\n"
        "try:\n"
        "    print('sleeping', flush=True)\n"
        "    time.sleep(300)\n"
        "except KeyboardInterrupt:\n"
        "    caught += 1\n"
        "    raise\n"
    )
    wait_for(
        lambda: (cells := _cells(service)) and len(cells) == 3 and cells[-1].state == "running",
        timeout=60,
        message="the third cell running",
    )
    wait_for(lambda: len(service.logs(_cells(service)[-1].id)[0]) >= 2, timeout=30)
    kernel.km.interrupt_kernel()
    msgs, reply = kernel.collect(msg_id, timeout=60)
    assert reply["status"] == "error"
    assert _cells(service)[-1].state == "cancelled"
    msgs, reply = kernel.execute("%%distributed --session llm\nprint('caught', caught)\n")
    assert rank_texts(msgs) == {0: "[rank 0] caught 1", 1: "[rank 1] caught 1"}
    assert all(run.process.poll() is None for run in runs.values())  # the same processes

    msgs, _ = kernel.execute("%distributed_session list")
    listing = "".join(
        str(m.get("text", m.get("data"))) for m in outputs(msgs, "stream", "display_data")
    )
    assert "llm   running  2/2 running" in listing, listing
    msgs, reply = kernel.execute("%distributed_session stop llm")
    assert reply["status"] == "ok", reply
    wait_for(lambda: objects_of(kube, kube_namespace, holder.id) == {}, timeout=60)
    for run in runs.values():
        assert run.wait(30) == 0  # asked to stop: atexit ran, exit 0


def test_pdb_on_a_kubernetes_session_rank(k8s, player, kernel):
    service = k8s()
    msg_id = kernel.kc.execute(
        "%%distributed --session dbg --backend kubernetes --workers 2 --framework none\nz = 5\n"
    )
    holder = wait_for(
        lambda: [
            j
            for j in service.store.list_jobs()[0]
            if j.origin.get("session") == "dbg" and not j.origin.get("session_job")
        ],
        timeout=60,
        message="the session's holder job",
    )[0]
    runs = {}
    for rank, pod in player.create_pods(player.resumed(holder.id)).items():
        player.schedule(pod)
        runs[rank] = player.run_rank(pod, pod_ip="127.0.0.1")
        player.end_when_exited(runs[rank])
    _, reply = kernel.collect(msg_id, timeout=120)
    assert reply["status"] == "ok", (reply, [r.text for r in runs.values()])

    # breakpoint() on rank 1: its prompt, named, here; `p x` shows its local; `c` resumes.
    text, reply, prompts = kernel.execute_answering(
        "%%distributed --session dbg\n"
        "import os\n"
        "x = 41 + int(os.environ['RANK'])\n"
        "if x == 42:\n"
        "    breakpoint()\n"
        "print('after', x)\n",
        ["p x", "c"],
        timeout=180,
    )
    assert reply["status"] == "ok", (reply, text)
    assert prompts == ["(Pdb rank 1) "] * 2, (prompts, text)
    assert "rank 1 paused at cell.py:5" in text and "\n42\n" in text, text
    assert "rank 1 goes on" in text, text

    # A failed cell's post-mortem on rank 1: its local, then `q`; the session goes on.
    _, reply = kernel.execute(
        "%%distributed --session dbg\n"
        "def step():\n"
        "    y = 41 + int(os.environ['RANK'])\n"
        "    if y == 42:\n"
        "        raise ValueError(f'boom {y}')\n"
        "step()\n",
        timeout=120,
    )
    assert reply["status"] == "error", reply
    text, reply, prompts = kernel.execute_answering(
        "%distributed_debug --rank 1", ["p y", "q"], timeout=180
    )
    assert reply["status"] == "ok", (reply, text)
    assert prompts == ["(Pdb) ", "(Pdb) "], (prompts, text)
    assert "pdb on rank 1" in text and "\n42\n" in text, text

    # A rank's code holds the job's key: what it says of pdb is judged, never trusted.
    _, reply = kernel.execute(
        "%%distributed --session dbg\n"
        "from jupyterlab_mlcluster.runtime import reporting\n"
        "if os.environ['RANK'] == '1':\n"
        "    pdb = {'type': 'pdb', 'record': {'paused': {'rank': 0, 'where': 'x'}}}\n"
        "    reporting.send({**pdb, 'link': '../../../pwned'})\n"
        "    reporting.send({**pdb, 'link': '0123456789abcdef', 'post_mortem': True})\n"
        "    reporting.send({**pdb, 'link': 'fedcba9876543210', 'record': {'out': 'hi'}})\n",
        timeout=120,
    )
    assert reply["status"] == "ok", reply
    refusals = [
        f"refused rank 1's {why}"
        for why in (
            "a pdb report that is not the relay's",
            "a pdb link (a post-mortem's output in a cell that is no debugger's)",
            "a pdb link that did not begin with a pause",
        )
    ]
    wait_for(
        lambda: all(
            r in "\n".join(line["line"] for line in service.logs(holder.id)[0]) for r in refusals
        ),
        timeout=30,
        message="the forged pdb reports refused, said in the session's log",
    )
    assert not list(service.store.root.parent.rglob("*pwned*"))
    assert not list(service.store.root.rglob(".pause-*")) + list(
        service.store.root.rglob("pause-*")
    )

    msgs, reply = kernel.execute("%%distributed --session dbg\nprint('kept', z)\n")
    assert rank_texts(msgs) == {0: "[rank 0] kept 5", 1: "[rank 1] kept 5"}, reply
    assert all(run.process.poll() is None for run in runs.values())  # the same ranks
    kernel.execute("%distributed_session stop dbg")
    for run in runs.values():
        assert run.wait(30) == 0
