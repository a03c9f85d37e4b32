"""What the live monitor costs a training: steps/s of the same 4-rank DDP loop, in one run.

    python bench/bench_monitor.py [--reps 5] [--workers 4] [--steps 300]

One real kernel (jupyter_client) runs the same training cell three ways, interleaved
(monitor, quiet, launcher, monitor, quiet, ...) so that a busy moment of the machine hurts
every method alike:
  monitor   `%%distributed --workers N`: the live monitor (widgets, rank table, log tabs)
  quiet     `%%distributed --workers N --quiet`: no monitor at all
  launcher  accelerate's notebook_launcher(fn, num_processes=N) called in the same kernel

The cell trains a small MLP with DistributedDataParallel (gloo, CPU) and, like a real
training loop, every rank prints a line every 10 steps. Rank 0 times steps 20..20+steps
and writes steps/s to a file (--quiet shows no output). The table shows medians over --reps and the ratios to `quiet`,
and the kernel process's own CPU seconds per cell (what the monitor itself spends).
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

TRAIN = textwrap.dedent(
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
    _WARM, _STEPS = 20, {steps}
    for _step in range(_WARM + _STEPS):
        if _step == _WARM:
            dist.barrier(); _t0 = _t.perf_counter()
        _opt.zero_grad()
        _loss = torch.nn.functional.mse_loss(_model(_x), _y)
        _loss.backward()
        _opt.step()
        if _step % 10 == 0:
            print(f"rank {{_rank}} step {{_step}} loss {{_loss.item():.4f}}", flush=True)
    dist.barrier()
    if _rank == 0:  # a file, not output: --quiet shows none
        with open(_os.environ["MLCB_RESULT"], "w") as _f:
            _f.write(str(_STEPS / (_t.perf_counter() - _t0)))
    dist.destroy_process_group()
    """
)

DRIVER = """
import json, os, sys
from jupyter_client.manager import start_new_kernel
workers, reps, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
TRAIN = sys.argv[4]
import psutil
km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
kernel = psutil.Process(km.provisioner.process.pid)
def kernel_cpu():
    times = kernel.cpu_times()
    return times.user + times.system
SETUP = (
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
    execute(SETUP)
    for rep in range(reps + 1):  # the first round warms up (imports, pool) and is not counted
        for method, cell in CELLS.items():
            if os.path.exists(RESULT):
                os.remove(RESULT)
            cpu = kernel_cpu()
            out = execute(cell)
            cpu = kernel_cpu() - cpu
            if not os.path.exists(RESULT):
                raise SystemExit(f"{method}: rank 0 wrote no result; the cell said:\\n{out[-2000:]}")
            if rep:
                with open(RESULT) as f:
                    print(json.dumps({"method": method, "steps_per_s": float(f.read()), "kernel_cpu": cpu}), flush=True)
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
    args = parser.parse_args()
    train = TRAIN.format(steps=args.steps)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(args.workers), str(args.reps), str(args.steps), train],
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
    results: dict[str, list[float]] = {}
    kernel_cpu: dict[str, list[float]] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            item = json.loads(line)
            results.setdefault(item["method"], []).append(item["steps_per_s"])
            kernel_cpu.setdefault(item["method"], []).append(item["kernel_cpu"])
    quiet = statistics.median(results["quiet"])
    print(f"{args.workers} ranks, {args.steps} timed steps, {args.reps} interleaved reps, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(
        f"{'method':<10} {'median steps/s':>15} {'min':>8} {'max':>8} {'vs quiet':>9} "
        f"{'kernel CPU s/cell':>18}"
    )
    for method, values in results.items():
        median = statistics.median(values)
        print(
            f"{method:<10} {median:>15.1f} {min(values):>8.1f} {max(values):>8.1f} "
            f"{median / quiet:>8.3f}x {statistics.median(kernel_cpu[method]):>18.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
