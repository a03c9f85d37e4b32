"""Sessions vs plain cells vs notebook_launcher: 20 small training cells on 4 ranks, one run.

    python bench/bench_sessions.py [--cells 20] [--workers 4] [--steps 5] [--only session]
                                   [--backend local|slurm]

`--backend slurm` runs every cell on a real one-node Slurm that the bench starts
(tests/slurm/cluster.py: munged, slurmctld, slurmd, as root; its node has 2 CPUs, so at
most 2 workers): the session is one allocation whose tasks serve the cells.

One real kernel (jupyter_client) on a fresh job store runs, in this order:
  session    `%%distributed --session bench --workers N`: cell 1 builds a small transformers
             model (GPT-2 shaped, 2 layers) in DDP and a synthetic data set; then --cells cells
             of --steps training steps each run on the same live ranks
  plain      --cells `%%distributed --workers N` cells, each building the model and data again
             and running the same steps (what a notebook does without sessions)
  launcher   --cells cells calling accelerate's notebook_launcher(fn, num_processes=N), fn
             building the model and running the steps (its processes are forked per call)

Each cell's time is the kernel's execute request to its reply (what the user waits). The
kernel imports transformers first, so the warm pool serves plain cells' ranks with it
preloaded: the comparison is against plain cells at their best.

Start latency of a session's cell (the goal: every rank running the cell's code within 20 ms
of submit, median): `submit` is the moment the kernel enters the `%%distributed` magic (a
wrapper the bench puts around the magic's entry in the kernel records time.time(); before
the magic parses its options), and each rank's first line writes time.time() to a file (one
machine, one clock); the figure is the latest rank's start minus submit. It is measured
over the session's training cells (--quiet) and over --latency-cells more cells that only
run that line, alternately with the live monitor and --quiet, after the loop; the table also
gives it from the cell's job record (JobRecord.created) and from the execute request's send.
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

REPO = Path(__file__).resolve().parent.parent

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
latency_cells = int(sys.argv[7])
PROBE_DIR = os.environ["MLCB_DIR"]
km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
def execute(code, user_expressions=None):
    sent = time.time()
    msg_id = kc.execute(code, user_expressions=user_expressions or {})
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
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    if reply["content"]["status"] != "ok":
        raise SystemExit("cell failed: " + "".join(text)[-3000:])
    return sent, time.time() - sent, reply["content"].get("user_expressions", {})
ENTERED = {"entered": "repr(_mlcb_entered[0])"}
def session_cell(code):  # a session cell whose first line is PROBE: (seconds, its start latencies)
    sent, took, expressions = execute(code, ENTERED)
    if "entered" not in expressions or expressions["entered"].get("status") != "ok":
        raise SystemExit(f"the magic's entry time did not come back: {expressions}")
    entered = float(expressions["entered"]["data"]["text/plain"].strip("'"))
    cell = service.store.list_jobs(limit=1)[0][0]
    starts = [float(open(os.path.join(PROBE_DIR, f"{cell.id}-{r}")).read()) for r in range(workers)]
    if not sent <= entered <= cell.created <= max(starts):
        raise SystemExit(f"timestamps out of order: {sent} {entered} {cell.created} {starts}")
    return took, dict(start_after_entry=max(starts) - entered, start_after_submit=max(starts) - cell.created,
                      start_after_send=max(starts) - sent)
def emit(**item):
    print(json.dumps(item), flush=True)
import jupyterlab_mlcluster.backends  # fills the backend registry
from jupyterlab_mlcluster.jobs.service import JobService
service = JobService()
try:
    execute(
        "import os, socket, tempfile, time, torch, transformers\\n"
        "from accelerate import notebook_launcher\\n"
        f"BUILD, STEPS = {BUILD!r}, {STEPS!r}\\n"
        "def _fn():\\n"
        "    exec(BUILD + STEPS, {'__name__': '__main__'})\\n"
        "    torch.distributed.destroy_process_group()\\n"
        "def _port():\\n"
        "    with socket.socket() as s:\\n"
        "        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]\\n"
        # submit = the magic entered: the awaited call a %%distributed cell becomes (autoawait)
        "_mlcb_entered = [0.0]\\n"
        "_mlcb_magics = get_ipython().magics_manager.registry['DistributedMagics']\\n"
        "_mlcb_enter = _mlcb_magics.distributed_async\\n"
        "async def _mlcb_timed(line, cell):\\n"
        "    _mlcb_entered[0] = time.time()\\n"
        "    return await _mlcb_enter(line, cell)\\n"
        "_mlcb_magics.distributed_async = _mlcb_timed\\n"
    )
    # A plain cell first: imports, the pool learning transformers; not counted.
    execute(f"%%distributed --workers {workers} --quiet\\n" + BUILD + STEPS)
    _, first, _ = execute(f"%%distributed --session bench --workers {workers} --quiet\\n" + BUILD)
    emit(method="session-build", seconds=first)
    for n in range(cells):
        took, start = session_cell("%%distributed --session bench --quiet\\n" + PROBE + STEPS)
        emit(method="session", seconds=took, **start)
    for n in range(latency_cells):
        quiet = n % 2 == 1
        took, start = session_cell("%%distributed --session bench" + (" --quiet" if quiet else "") + "\\n" + PROBE)
        emit(method="latency-quiet" if quiet else "latency-monitor", seconds=took, **start)
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
        "--latency-cells",
        type=int,
        default=20,
        help="cells that only time their start on the session (half with the monitor)",
    )
    parser.add_argument(
        "--only",
        default="session,plain,launcher",
        help="the methods to run besides the session (comma-separated; the session always runs)",
    )
    parser.add_argument("--backend", choices=("local", "slurm"), default="local")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    load_before = os.getloadavg()
    (work / "probe").mkdir()
    env = {
        **os.environ,
        "MLCB_DIR": str(work / "probe"),
        "MLCLUSTER_STORE_DIR": str(work / "store"),  # a fresh store: nothing else queued
        "MLCLUSTER_BACKEND": args.backend,
    }
    cluster = None
    if args.backend == "slurm":
        sys.path[:0] = [str(REPO), str(REPO / "tests")]
        from tests.slurm.cluster import SlurmCluster, missing

        why = missing()
        if why:
            print(f"no Slurm here: {why}", file=sys.stderr)
            return 1
        cluster = SlurmCluster(work / "slurm")
        cluster.start()
        env["SLURM_CONF"] = str(cluster.conf)
        config = work / "jupyter-config"
        config.mkdir()
        (config / "jupyter_mlcluster_config.json").write_text(
            json.dumps({"MLClusterConfig": {"slurm_poll_interval": 0.2}})
        )
        env["JUPYTER_CONFIG_DIR"] = str(config)
    try:
        return _run(args, work, env, load_before)
    finally:
        if cluster is not None:
            cluster.stop()


def _run(args, work: Path, env: dict[str, str], load_before) -> int:
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
            str(args.latency_cells),
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
        f"{args.backend} backend, {args.workers} ranks, {args.cells} cells of {args.steps}"
        f" training steps each (GPT-2 shaped, 2 layers, DDP over gloo on CPU),"
        f" {os.cpu_count()} cores"
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
    print(
        "session cell: every rank running the cell's first line, ms after submit (the magic"
        " entered)\n"
        f"{'cells':<26} {'n':>3} {'median':>7} {'p90':>7} {'min':>7} {'max':>7}"
        f" {'from record':>12} {'from request':>13}"
    )
    for method, label in (
        ("session", "training loop, --quiet"),
        ("latency-monitor", "start only, monitor"),
        ("latency-quiet", "start only, --quiet"),
    ):
        if method not in by:
            continue
        entry = sorted(i["start_after_entry"] * 1000 for i in by[method])
        record = [i["start_after_submit"] * 1000 for i in by[method]]
        send = [i["start_after_send"] * 1000 for i in by[method]]
        print(
            f"{label:<26} {len(entry):>3} {statistics.median(entry):>7.1f} {_p90(entry):>7.1f}"
            f" {entry[0]:>7.1f} {entry[-1]:>7.1f} {statistics.median(record):>12.1f}"
            f" {statistics.median(send):>13.1f}"
        )
    print(
        "load average (1, 5, 15 min) before: "
        + " ".join(f"{x:.2f}" for x in load_before)
        + "; after: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    return 0


def _p90(ordered: list[float]) -> float:
    """The 90th percentile of sorted values (nearest rank)."""
    return ordered[max(0, -(-len(ordered) * 9 // 10) - 1)]


if __name__ == "__main__":
    sys.exit(main())
