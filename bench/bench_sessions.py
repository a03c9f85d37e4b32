"""Sessions vs plain cells vs notebook_launcher: 20 small training cells on 4 ranks, one run.

    python bench/bench_sessions.py [--cells 20] [--workers 4] [--steps 5] [--only session]

One real kernel (jupyter_client) on a fresh job store runs, in this order:
  session    `%%distributed --session bench --workers N`: cell 1 builds a small transformers
             model (GPT-2 shaped, 2 layers) in DDP and a synthetic data set; then --cells cells
             of --steps training steps each run on the same live ranks
  plain      --cells `%%distributed --workers N` cells, each building the model and data again
             and running the same steps (what a notebook does without sessions)
  launcher   --cells cells calling accelerate's notebook_launcher(fn, num_processes=N), fn
             building the model and running the steps (its processes are forked per call)

Each cell's time is the kernel's execute request to its reply (what the user waits). For the
session's cells it also reports how soon after submit every rank runs the cell's first line:
`submit` is the moment the cell's job record is made (JobRecord.created, in the magic), and
each rank's first line writes time.time() to a file; the figure is the latest rank's start
minus submit (and, as seen from the kernel, minus the execute request's send time). The
kernel imports transformers first, so the warm pool serves plain cells' ranks with it
preloaded: the comparison is against plain cells at their best.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

BUILD = textwrap.dedent(
    """
    import os, time
    import torch, torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=64)
    model = torch.nn.parallel.DistributedDataParallel(GPT2LMHeadModel(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 1000, (256, 32), generator=torch.Generator().manual_seed(dist.get_rank()))
    step = 0
    """
)

STEPS = textwrap.dedent(
    """
    for _ in range({steps}):
        batch = data[(step * 8) % 256:(step * 8) % 256 + 8]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
    """
)

# A session cell's first line: when this rank started running it.
PROBE = (
    "import os as _o, time as _tm\n"
    "open(_o.path.join(_o.environ['MLCB_DIR'], _o.environ['MLCLUSTER_JOB_CELL'] + '-' +"
    " _o.environ['RANK']), 'w').write(repr(_tm.time()))\n"
)

DRIVER = """
import json, os, sys, time
from jupyter_client.manager import start_new_kernel
workers, cells, BUILD, STEPS, PROBE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
METHODS = sys.argv[6].split(",")
PROBE_DIR = os.environ["MLCB_DIR"]
km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
def execute(code):
    sent = time.time()
    msg_id = kc.execute(code)
    text = []
    while True:
        msg = kc.get_iopub_msg(timeout=900)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        if msg["msg_type"] == "stream":
            text.append(content["text"])
        elif msg["msg_type"] == "error":
            text.append("\\n".join(content["traceback"]))
        elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=60)
    if reply["content"]["status"] != "ok":
        raise SystemExit("cell failed: " + "".join(text)[-3000:])
    return sent, time.time() - sent
def emit(**item):
    print(json.dumps(item), flush=True)
import jupyterlab_mlcluster.backends  # fills the backend registry
from jupyterlab_mlcluster.jobs.service import JobService
service = JobService()
try:
    execute(
        "import os, socket, tempfile, torch, transformers\\n"
        "from accelerate import notebook_launcher\\n"
        f"BUILD, STEPS = {BUILD!r}, {STEPS!r}\\n"
        "def _fn():\\n"
        "    exec(BUILD + STEPS, {'__name__': '__main__'})\\n"
        "    torch.distributed.destroy_process_group()\\n"
        "def _port():\\n"
        "    with socket.socket() as s:\\n"
        "        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]\\n"
    )
    # A plain cell first: imports, the pool learning transformers; not counted.
    execute(f"%%distributed --workers {workers} --quiet\\n" + BUILD + STEPS)
    _, first = execute(f"%%distributed --session bench --workers {workers} --quiet\\n" + BUILD)
    emit(method="session-build", seconds=first)
    for n in range(cells):
        sent, took = execute("%%distributed --session bench --quiet\\n" + PROBE + STEPS)
        cell = service.store.list_jobs(limit=1)[0][0]
        starts = [float(open(os.path.join(PROBE_DIR, f"{cell.id}-{r}")).read()) for r in range(workers)]
        emit(method="session", seconds=took, start_after_submit=max(starts) - cell.created,
             start_after_send=max(starts) - sent)
    for n in range(cells if "plain" in METHODS else 0):
        emit(method="plain", seconds=execute(f"%%distributed --workers {workers} --quiet\\n" + BUILD + STEPS)[1])
    for n in range(cells if "launcher" in METHODS else 0):
        emit(method="launcher", seconds=execute(
            "with tempfile.TemporaryFile('a+') as _cap:\\n"
            "    _saved = os.dup(1); os.dup2(_cap.fileno(), 1)\\n"
            "    try:\\n"
            f"        notebook_launcher(_fn, num_processes={workers}, use_port=str(_port()))\\n"
            "    finally:\\n"
            "        os.dup2(_saved, 1); os.close(_saved)\\n"
        )[1])
    execute("%distributed_session stop bench")
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--only",
        default="session,plain,launcher",
        help="the methods to run besides the session (comma-separated; the session always runs)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    (work / "probe").mkdir()
    env = {
        **os.environ,
        "MLCB_DIR": str(work / "probe"),
        "MLCLUSTER_STORE_DIR": str(work / "store"),  # a fresh store: nothing else queued
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(args.workers),
            str(args.cells),
            BUILD,
            STEPS.format(steps=args.steps),
            PROBE,
            args.only,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env=env,
        start_new_session=True,  # a hung run is killed whole, ranks included
    )
    try:
        stdout, stderr = proc.communicate(timeout=3600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print("no answer after 3600 s", file=sys.stderr)
        return 1
    items = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    by: dict[str, list[dict]] = {}
    for item in items:
        by.setdefault(item["method"], []).append(item)
    if proc.returncode != 0:
        # What was measured is still worth its lines (a run is long); then why it stopped.
        print(json.dumps(by, indent=1))
        print(stdout[-2000:], stderr[-3000:], file=sys.stderr)
        return 1
    print(
        f"{args.workers} ranks, {args.cells} cells of {args.steps} training steps each "
        f"(GPT-2 shaped, 2 layers, DDP over gloo on CPU), {os.cpu_count()} cores"
    )
    print(f"session: building the model once took {by['session-build'][0]['seconds']:.2f} s")
    totals = {}
    print(f"{'method':<10} {'total s':>9} {'median s/cell':>14} {'min':>7} {'max':>7}")
    for method in [m for m in ("session", "plain", "launcher") if m in by]:
        seconds = [i["seconds"] for i in by[method]]
        totals[method] = sum(seconds)
        print(
            f"{method:<10} {totals[method]:>9.2f} {statistics.median(seconds):>14.3f} "
            f"{min(seconds):>7.3f} {max(seconds):>7.3f}"
        )
    for method in [m for m in ("plain", "launcher") if m in by]:
        print(f"session loop vs {method}: {totals[method] / totals['session']:.1f}x faster")
    submit = [i["start_after_submit"] * 1000 for i in by["session"]]
    send = [i["start_after_send"] * 1000 for i in by["session"]]
    print(
        "session cell: every rank running the cell's code, after submit (job record made): "
        f"median {statistics.median(submit):.1f} ms (min {min(submit):.1f}, max {max(submit):.1f});"
        f" after the kernel's execute request: median {statistics.median(send):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
