"""What the live monitor costs a training: steps/s of the same 4-rank DDP loop, in one run.

    python bench/bench_monitor.py [--reps 5] [--workers 4] [--steps 300]

One real kernel (jupyter_client) runs the same training five ways, interleaved (monitor,
quiet, launcher, session, session-quiet, monitor, ...) so that a busy moment of the machine
hurts every method alike:
  monitor        `%%distributed --workers N`: the live monitor (widgets, rank table, log tabs)
  quiet          `%%distributed --workers N --quiet`: no monitor at all
  launcher       accelerate's notebook_launcher(fn, num_processes=N) called in the same kernel
  session        `%%distributed --session monitor`: the loop alone, on a session's live ranks
                 (a first cell set up the process group and the model), with the live monitor
  session-quiet  the same session cell with --quiet
  stall-on       `--quiet --stall-after 5m`: a job's stall watch on (its supervisor watches each
                 output line and CPU sample for a rank that has stopped)
  stall-off      `--quiet --stall-after 0`: the watch off (`stall-on` is measured against it)
  log-on         `--quiet`, and every rank calls `mlc.log(loss=..., lr=...)` every step
  log-off        the same loop taking the same `loss.item()` without logging it (`log-on` is
                 measured against it)

The cell trains a small MLP with DistributedDataParallel (gloo, CPU) and, like a real
training loop, every rank prints a line every 10 steps. Rank 0 times steps 20..20+steps
and writes steps/s to a file (--quiet shows no output). The table shows medians over --reps
and the ratios to `quiet` (a session's: to `session-quiet`), and the kernel process's own CPU
seconds per cell (what the monitor itself spends).
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

SETUP = textwrap.dedent(
    """
    import os as _os, time as _t
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    _rank = dist.get_rank()
    _model = DDP(torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)))
    _opt = torch.optim.SGD(_model.parameters(), lr=0.01)
    _x, _y = torch.randn(32, 64), torch.randn(32, 64)
    """
)

# The timed loop: a job's cell runs SETUP first; a session's cells run it alone, on ranks
# that ran SETUP once.
LOOP = textwrap.dedent(
    """
    _WARM, _STEPS = 20, {steps}
    for _step in range(_WARM + _STEPS):
        if _step == _WARM:
            dist.barrier(); _t0 = _t.perf_counter()
        _opt.zero_grad()
        _loss = torch.nn.functional.mse_loss(_model(_x), _y)
        _loss.backward()
        _opt.step()
        {log}
        if _step % 10 == 0:
            print(f"rank {{_rank}} step {{_step}} loss {{_loss.item():.4f}}", flush=True)
    dist.barrier()
    if _rank == 0:  # a file, not output: --quiet shows none
        with open(_os.environ["MLCB_RESULT"], "w") as _f:
            _f.write(str(_STEPS / (_t.perf_counter() - _t0)))
    """
)

# The line each step adds: `log-on` logs the loss, `log-off` only takes it (the same sync).
LOG_LINES = {
    "log-on": "_mlc.log(loss=_loss.item(), lr=0.01)",
    "log-off": "_loss.item()",
    "": "pass",
}
METHODS = (
    "monitor",
    "quiet",
    "launcher",
    "session",
    "session-quiet",
    "stall-on",
    "stall-off",
    "log-on",
    "log-off",
)
# What each method's monitor cost is measured against (the others: `quiet`).
QUIET = {
    "session": "session-quiet",
    "session-quiet": "session-quiet",
    "stall-on": "stall-off",
    "stall-off": "stall-off",
    "log-on": "log-off",
    "log-off": "log-off",
}

DRIVER = """
import json, os, sys, time
from jupyter_client.manager import start_new_kernel
workers, reps, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
SETUP, LOOP = sys.argv[4], sys.argv[5]
ONLY = sys.argv[6].split(",")
LOG_ON, LOG_OFF = sys.argv[7], sys.argv[8]
TRAIN = SETUP + LOOP + "dist.destroy_process_group()\\n"
def _train(loop):
    return "import jupyterlab_mlcluster as _mlc\\n" + SETUP + loop + "dist.destroy_process_group()\\n"
import psutil
km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
kernel = psutil.Process(km.provisioner.process.pid)
def kernel_cpu():
    times = kernel.cpu_times()
    return times.user + times.system
KERNEL_SETUP = (
    "import os, socket, tempfile, torch\\n"
    "from accelerate import notebook_launcher\\n"
    f"TRAIN = {TRAIN!r}\\n"
    "def _fn(): exec(TRAIN, {'__name__': '__main__'})\\n"
    "def _port():\\n"
    "    with socket.socket() as s:\\n"
    "        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]\\n"
)
RESULT = os.environ["MLCB_RESULT"]  # the ranks inherit it (the kernel's environment)
CELLS = {
    "monitor": f"%%distributed --workers {workers}\\n" + TRAIN,
    "quiet": f"%%distributed --workers {workers} --quiet\\n" + TRAIN,
    # The forked ranks write to the kernel's fd 1: collect it in a file, print it at the end.
    "launcher": (
        "with tempfile.TemporaryFile('a+') as _cap:\\n"
        "    _saved = os.dup(1); os.dup2(_cap.fileno(), 1)\\n"
        "    try:\\n"
        f"        notebook_launcher(_fn, num_processes={workers}, use_port=str(_port()))\\n"
        "    finally:\\n"
        "        os.dup2(_saved, 1); os.close(_saved)\\n"
        "    _cap.seek(0); print(_cap.read())\\n"
    ),
    # The same loop on a session's live ranks (SETUP ran once, below), monitor and not.
    "session": "%%distributed --session monitor\\n" + LOOP,
    "session-quiet": "%%distributed --session monitor --quiet\\n" + LOOP,
    "stall-on": f"%%distributed --workers {workers} --quiet --stall-after 5m\\n" + TRAIN,
    "stall-off": f"%%distributed --workers {workers} --quiet --stall-after 0\\n" + TRAIN,
    "log-on": f"%%distributed --workers {workers} --quiet\\n" + _train(LOG_ON),
    "log-off": f"%%distributed --workers {workers} --quiet\\n" + _train(LOG_OFF),
}
def execute(code):
    msg_id = kc.execute(code)
    text = []
    while True:
        msg = kc.get_iopub_msg(timeout=600)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        if msg["msg_type"] in ("display_data", "update_display_data"):
            text.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "stream":
            text.append(content["text"])
        elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "\\n".join(text)
try:
    execute(KERNEL_SETUP)
    sessions = any(method.startswith("session") for method in ONLY)
    if sessions:
        execute(f"%%distributed --session monitor --workers {workers} --quiet\\n" + SETUP)
    for rep in range(reps + 1):  # the first round warms up (imports, pool) and is not counted
        for method, cell in CELLS.items():
            if method not in ONLY:
                continue
            if os.path.exists(RESULT):
                os.remove(RESULT)
            cpu, wall = kernel_cpu(), time.monotonic()
            out = execute(cell)
            cpu, wall = kernel_cpu() - cpu, time.monotonic() - wall
            if not os.path.exists(RESULT):
                raise SystemExit(f"{method}: rank 0 wrote no result; the cell said:\\n{out[-2000:]}")
            if rep:
                with open(RESULT) as f:
                    print(json.dumps({"method": method, "rep": rep, "steps_per_s": float(f.read()), "kernel_cpu": cpu, "wall": wall}), flush=True)
    if sessions:
        execute("%distributed_session stop monitor")
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--only",
        default=",".join(METHODS),
        help="the methods to run, comma-separated (each one's `vs quiet` needs its quiet one)",
    )
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"--only: no method {', '.join(sorted(unknown))} (of {', '.join(METHODS)})")
    loop, log_on, log_off = (
        LOOP.format(steps=args.steps, log=LOG_LINES[key]) for key in ("", "log-on", "log-off")
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER,
            str(args.workers),
            str(args.reps),
            str(args.steps),
            SETUP,
            loop,
            args.only,
            log_on,
            log_off,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
        env={**os.environ, "MLCB_RESULT": str(Path(tempfile.mkdtemp()) / "steps")},
        start_new_session=True,  # a hung run is killed whole, ranks included
    )
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print("no answer after 1800 s", file=sys.stderr)
        return 1
    if proc.returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
        return 1
    results: dict[str, dict[int, float]] = {}
    kernel_cpu: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            results.setdefault(item["method"], {})[item["rep"]] = item["steps_per_s"]
            kernel_cpu.setdefault(item["method"], []).append(item["kernel_cpu"])
            wall.setdefault(item["method"], []).append(item["wall"])
    print(f"{args.workers} ranks, {args.steps} timed steps, {args.reps} interleaved reps, "
          f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    # `vs quiet`: the ratio of the medians; `paired`: the median of each round's ratio to its
    # quiet method's run of the same round (the two ran seconds apart: less of the machine's
    # other load between them). `monitor CPU`: what the kernel spent per cell beyond its quiet
    # method's, as a share of the machine's CPU time over the cell: all the monitor can take
    # from the ranks, a bound that the machine's other load does not blur as it does steps/s.
    print(
        f"{'method':<14} {'median steps/s':>15} {'min':>8} {'max':>8} {'vs quiet':>9} "
        f"{'paired':>8} {'kernel CPU s/cell':>18} {'monitor CPU':>12}"
    )
    cores = os.cpu_count() or 1
    for method, by_rep in results.items():
        values = list(by_rep.values())
        median = statistics.median(values)
        quiet = QUIET.get(method, "quiet")
        against = results.get(quiet)
        cpu = statistics.median(kernel_cpu[method])
        if against:
            ratio = f"{median / statistics.median(against.values()):>8.3f}x"
            paired = f"{statistics.median(v / against[r] for r, v in by_rep.items()):>7.3f}x"
            extra = (cpu - statistics.median(kernel_cpu[quiet])) / (
                statistics.median(wall[method]) * cores
            )
            share = f"{extra * 100:>11.2f}%"
        else:
            ratio, paired, share = f"{'–':>9}", f"{'–':>8}", f"{'–':>12}"
        print(
            f"{method:<14} {median:>15.1f} {min(values):>8.1f} {max(values):>8.1f} {ratio} "
            f"{paired} {cpu:>18.3f} {share}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
