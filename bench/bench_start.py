"""Start latency of a 4-rank gloo all_reduce, measured in one run against the alternatives.

    python bench/bench_start.py [--runs 5] [--workers 4] [--skip torchrun,...]

Every method runs the same user code (a gloo all_reduce of rank+1) and reports, per run:
  up     - seconds from the request until the last rank runs the first line of user code
  ready  - seconds until the last rank has finished init_process_group + all_reduce
  total  - seconds until the caller has the job's end (command returned / call returned)

Methods:
  torchrun             torchrun --standalone --nproc_per_node N script.py
  notebook_launcher    accelerate.notebook_launcher(fn, num_processes=N) from a process that
                       has already imported torch (like a notebook kernel); forks that process
  mlcluster-warm       jupyterlab_mlcluster.submit(...).wait() with the warm pool (fresh,
                       CUDA-clean interpreters forked from a zygote)
  mlcluster-cold       the same with MLCLUSTER_WARM_POOL=0 (new interpreters, import torch)
  cli-warm / cli-cold  `mlcluster run --workers N script.py` (includes the CLI's own start)
  launcher-in-kernel   notebook_launcher called in a notebook cell of a real kernel
                       (jupyter_client): from execute_request to the cell's reply
  magic                `%%distributed --workers N` in a cell of a real kernel, measured the same
                       way: the fair comparison for the notebook user

Scenarios (--scenarios), added to the same table: the kernel has imported more than torch
and the cell uses it, each as `%%distributed` vs notebook_launcher in a cell vs torchrun:
  transformers         `from transformers import BertConfig, BertModel`; the cell builds a
                       small BertModel from a config on every rank
  pandas+sklearn       pandas and scikit-learn; the cell fits a LogisticRegression on a frame
  accelerate+transformers
                       the transformers cells, and after the first one the notebook runs
                       notebook_launcher once (a no-op on 2 processes): the kernel has imported
                       accelerate, which the cells never use, and the pool starts building a
                       generation with it just before the next cell, which must not wait for it
--load N runs N busy processes beside the measurement (a loaded machine); the "worst" column
is the slowest counted run (a median hides the one cell that waited).
The warm pool learns the kernel's imports right after the cell that imported them (in the
background) and serves the first %%distributed cell from a generation that has them when it
comes after that build (--pause: seconds between the setup cell and the first measured cell;
at 0 the first cell comes at once and may still pay for the imports: the "first" column).

Medians over --runs runs, after one first (warm-up) run per method that is not counted but
shown ("first").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# What a notebook has imported before the cell (its kernel's setup) and what the cell does on
# top of the all_reduce. The torch scenario is the plain all_reduce the methods above compare.
SCENARIOS = {
    "torch": ("import torch", ""),
    "transformers": (
        "import torch\nfrom transformers import BertConfig, BertModel",
        (
            "from transformers import BertConfig, BertModel\n"
            "_model = BertModel(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, "
            "num_attention_heads=2, intermediate_size=128))\n"
        ),
    ),
    "pandas+sklearn": (
        "import torch, pandas\nfrom sklearn.linear_model import LogisticRegression",
        (
            "import pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n"
            "_df = pd.DataFrame({'a': range(100), 'b': [i % 2 for i in range(100)]})\n"
            "LogisticRegression().fit(_df[['a']], _df['b'])\n"
        ),
    ),
}
# The same cells as "transformers", and after the first one the notebook runs
# notebook_launcher once: the kernel imports accelerate, which the cells never use, and the
# pool starts learning it (a generation with it is built) just before the next cell.
SCENARIOS["accelerate+transformers"] = SCENARIOS["transformers"]
INTERLUDES = {
    "accelerate+transformers": (
        "from accelerate import notebook_launcher as _nl0\n"
        "from bench_start import free_port as _fp0\n"
        "def _noop(): pass\n"
        "_nl0(_noop, num_processes=2, use_port=str(_fp0()))\n"
    ),
}


def scenario_code(name: str) -> str:
    """USER_CODE with the scenario's own work between the first line and the all_reduce."""
    head, sep, tail = USER_CODE.partition("import torch, torch.distributed as dist\n")
    return head + sep + SCENARIOS[name][1] + tail


USER_CODE = textwrap.dedent(
    """
    import time as _t; _T0 = _t.time()
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    _x = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(_x)
    assert _x.item() == sum(range(1, dist.get_world_size() + 1))
    import os as _os  # one write per line: ranks that share a pipe or file never interleave
    _os.write(1, f"MLCB {dist.get_rank()} {_T0} {_t.time()}\\n".encode())
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    """A port nothing listens on now (notebook_launcher's default 29500 may be taken)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_marks(text: str) -> list[tuple[float, float]]:
    # findall, not per line: ranks sharing one pipe (torchrun) can land on the same line
    return [(float(a), float(b)) for _, a, b in re.findall(r"MLCB (\d+) ([\d.]+) ([\d.]+)", text)]


def summarize(
    t0: float, marks: list[tuple[float, float]], t_end: float, workers: int
) -> dict[str, float]:
    if len(marks) != workers:
        raise RuntimeError(f"expected {workers} ranks to report, got {len(marks)}")
    return {
        "up": max(s for s, _ in marks) - t0,
        "ready": max(d for _, d in marks) - t0,
        "total": t_end - t0,
    }


# -- each method runs in its own subprocess and prints one JSON result per run ----------------

DRIVER_TORCHRUN = """
import json, subprocess, sys, time
from bench_start import parse_marks, summarize
script, workers, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(runs + 1):
    t0 = time.time()
    out = subprocess.run(["torchrun", "--standalone", f"--nproc_per_node={workers}", script],
                         capture_output=True, text=True, check=True).stdout
    r = summarize(t0, parse_marks(out), time.time(), workers)
    r['i'] = i; print(json.dumps(r), flush=True)
"""

DRIVER_LAUNCHER = """
import io, json, os, sys, time, contextlib, tempfile
import torch  # a notebook that trains has imported torch before it launches
from accelerate import notebook_launcher
from bench_start import USER_CODE, free_port, parse_marks, summarize
workers, runs = int(sys.argv[1]), int(sys.argv[2])
def fn():
    exec(USER_CODE, {"__name__": "__main__"})
for i in range(runs + 1):
    # the forked ranks write to our stdout file descriptor: capture it at the fd level
    with tempfile.TemporaryFile("a+") as cap:  # O_APPEND: 4 forked writers, no overwrites
        saved = os.dup(1)
        os.dup2(cap.fileno(), 1)
        port = free_port()
        try:
            t0 = time.time()
            # A port of its own (not the default 29500): what else listens there is no concern
            # of this measurement. Picking it is outside the timed part for every method.
            notebook_launcher(fn, num_processes=workers, use_port=str(port))
            t_end = time.time()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        cap.seek(0)
        r = summarize(t0, parse_marks(cap.read()), t_end, workers)
    r['i'] = i; print(json.dumps(r), flush=True)
"""

DRIVER_API = """
import json, sys, time
import jupyterlab_mlcluster as mlc
from bench_start import USER_CODE, parse_marks, summarize
workers, runs = int(sys.argv[1]), int(sys.argv[2])
for i in range(runs + 1):
    t0 = time.time()
    job = mlc.submit(USER_CODE, workers=workers)
    job.wait()
    t_end = time.time()
    r = summarize(t0, parse_marks(job.logs()), t_end, workers)
    r['i'] = i; print(json.dumps(r), flush=True)
"""

DRIVER_CLI = """
import json, subprocess, sys, time
from bench_start import parse_marks, summarize
script, workers, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(runs + 1):
    t0 = time.time()
    out = subprocess.run(["mlcluster", "run", "--workers", str(workers), script],
                         capture_output=True, text=True, check=True).stdout
    r = summarize(t0, parse_marks(out), time.time(), workers)
    r['i'] = i; print(json.dumps(r), flush=True)
"""

# The same kernel driver for both notebook methods: from execute_request to the cell's reply.
DRIVER_KERNEL = """
import json, os, sys, time
from jupyter_client.manager import start_new_kernel
from bench_start import INTERLUDES, SCENARIOS, parse_marks, scenario_code, summarize
workers, runs, method, scenario = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
SETUP = SCENARIOS[scenario][0] + "\\n" + {  # what the notebook imported before the cell
    "magic": "",
    "launcher": (
        "import os, tempfile\\n"
        "from accelerate import notebook_launcher\\n"
        "from bench_start import scenario_code, free_port\\n"
        f"_CODE = scenario_code({scenario!r})\\n"
        "def _fn(): exec(_CODE, {'__name__': '__main__'})\\n"
    ),
}[method]
CELL = {
    "magic": f"%%distributed --workers {workers}\\n" + scenario_code(scenario),
    # The forked ranks write to the kernel's fd 1: collect it in a file, print it at the end.
    "launcher": (
        "_port_ = free_port()\\n"
        "with tempfile.TemporaryFile('a+') as _cap:\\n"
        "    _saved = os.dup(1); os.dup2(_cap.fileno(), 1)\\n"
        "    try:\\n"
        f"        notebook_launcher(_fn, num_processes={workers}, use_port=str(_port_))\\n"
        "    finally:\\n"
        "        os.dup2(_saved, 1); os.close(_saved)\\n"
        "    _cap.seek(0); print(_cap.read())\\n"
    ),
}[method]
def execute(code):
    msg_id = kc.execute(code)
    texts = {}
    while True:
        msg = kc.get_iopub_msg(timeout=300)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("display_data", "update_display_data"):
            did = msg["content"].get("transient", {}).get("display_id", "")
            texts[did] = msg["content"]["data"].get("text/plain", "")
        if msg["msg_type"] == "stream":
            texts.setdefault("stream", "")
            texts["stream"] += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "\\n".join(texts.values())
try:
    execute(SETUP)
    time.sleep(float(os.environ.get("BENCH_PAUSE", "0")))  # the user reading, writing the cell
    for i in range(runs + 1):
        if i == 1 and scenario in INTERLUDES:  # after the first cell, before the counted ones
            execute(INTERLUDES[scenario])
        t0 = time.time()
        out = execute(CELL)
        r = summarize(t0, parse_marks(out), time.time(), workers)
        r['i'] = i; print(json.dumps(r), flush=True)
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


DRIVER_TIMEOUT = 900


def run_driver(source: str, args: list[str], env: dict[str, str]) -> list[dict[str, float]]:
    # Own session, killed whole on a timeout: a method that hangs (forked ranks can deadlock)
    # must not leave its ranks behind holding ports.
    proc = subprocess.Popen(
        [sys.executable, "-c", source, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parent,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=DRIVER_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"no answer after {DRIVER_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise RuntimeError(stderr[-3000:])
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip", default="", help="comma-separated methods to skip")
    parser.add_argument(
        "--scenarios",
        default="transformers,pandas+sklearn",
        help="notebook scenarios measured after the methods (%%%%distributed vs "
        "notebook_launcher in a cell vs torchrun), comma-separated; '' for none",
    )
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="busy processes (one CPU-bound loop each) running throughout, to measure under "
        "load (default 0)",
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds between a kernel's setup cell (its imports) and its first measured "
        "cell, as a user takes (default 0: the first cell comes at once)",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    os.environ["BENCH_PAUSE"] = str(args.pause)
    tmp = Path(tempfile.mkdtemp(prefix="mlcluster-bench-"))
    script = tmp / "allreduce.py"
    script.write_text(USER_CODE)
    repo = Path(__file__).resolve().parent.parent  # the checkout under measurement
    base_env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(repo)]),
        MLCLUSTER_STORE_DIR=str(tmp / "store"),
    )
    base_env["MLCLUSTER_WARM_POOL_DIR"] = str(tmp / "pool")
    warm = dict(base_env, MLCLUSTER_WARM_POOL="1")
    cold = dict(base_env, MLCLUSTER_WARM_POOL="0")
    w, n = str(args.workers), str(args.runs)
    # label -> (driver, its arguments, environment, the label it is compared with)
    methods = {
        "torchrun": (DRIVER_TORCHRUN, [str(script), w, n], base_env, None),
        "notebook_launcher": (DRIVER_LAUNCHER, [w, n], base_env, None),
        "mlcluster-warm": (DRIVER_API, [w, n], warm, "notebook_launcher"),
        "mlcluster-cold": (DRIVER_API, [w, n], cold, "notebook_launcher"),
        "cli-warm": (DRIVER_CLI, [str(script), w, n], warm, "notebook_launcher"),
        "cli-cold": (DRIVER_CLI, [str(script), w, n], cold, "notebook_launcher"),
        "launcher-in-kernel": (DRIVER_KERNEL, [w, n, "launcher", "torch"], base_env, None),
        # Like with like: a cell is compared with notebook_launcher called from a cell.
        "magic": (DRIVER_KERNEL, [w, n, "magic", "torch"], warm, "launcher-in-kernel"),
    }
    torchrun_of = dict.fromkeys(methods, "torchrun")
    for scenario in filter(None, args.scenarios.split(",")):
        scenario_script = (
            tmp / f"cell_{re.sub(r'[^a-z]', '_', scenario)}.py"
        )  # never shadowing a package
        scenario_script.write_text(scenario_code(scenario))
        t, k, m = (f"{scenario}: {x}" for x in ("torchrun", "launcher-in-kernel", "magic"))
        methods[t] = (DRIVER_TORCHRUN, [str(scenario_script), w, n], base_env, None)
        methods[k] = (DRIVER_KERNEL, [w, n, "launcher", scenario], base_env, None)
        methods[m] = (DRIVER_KERNEL, [w, n, "magic", scenario], warm, k)
        torchrun_of.update(dict.fromkeys((t, k, m), t))
    # A method skipped is skipped in every scenario too ("torchrun" skips "transformers:
    # torchrun"); a scenario's one by its full label.
    methods = {
        k: v for k, v in methods.items() if k not in skip and k.rpartition(": ")[2] not in skip
    }
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)
    ]
    results: dict[str, dict[str, float]] = {}
    failed: list[str] = []
    print(
        f"# {args.workers}-rank gloo all_reduce, median of {args.runs} runs after a first "
        f"(warm-up) one, {os.cpu_count()} CPUs, {args.load} busy processes beside",
        flush=True,
    )
    try:
        for name, (driver, dargs, env, _) in methods.items():
            try:
                runs = run_driver(driver, dargs, env)
            except RuntimeError as exc:  # say so, measure the others, exit non-zero at the end
                print(f"  {name:<18} FAILED:\n{exc}", file=sys.stderr, flush=True)
                failed.append(name)
                continue
            counted = [r for r in runs if r.get("i")]
            results[name] = {
                k: statistics.median(r[k] for r in counted) for k in ("up", "ready", "total")
            }
            results[name]["first"] = next(r["total"] for r in runs if r.get("i") == 0)
            # The slowest counted run: a median hides the one cell that waited.
            results[name]["worst"] = max(r["total"] for r in counted)
            print(
                f"  {name:<18} done (load average {os.getloadavg()[0]:.1f})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    _stop_pools(tmp / "pool")
    width = max(map(len, methods)) + 1
    print(
        f"{'method':<{width}} {'first (s)':>9} {'up (s)':>8} {'ready (s)':>10} {'total (s)':>10} "
        f"{'worst (s)':>10} {'vs torchrun':>12} {'vs launcher':>12} {'worst vs l.':>12}"
    )
    for name, r in results.items():
        vs_t = results.get(torchrun_of[name], {}).get("total")
        baseline = methods[name][3]
        vs_l = results.get(baseline, {}).get("total") if baseline else None
        ratio_t = f"{vs_t / r['total']:.1f}x faster" if vs_t else "-"
        ratio_l = f"{r['total'] / vs_l:.2f}x" if vs_l else "-"
        worst_l = f"{r['worst'] / vs_l:.2f}x" if vs_l else "-"
        print(
            f"{name:<{width}} {r['first']:>9.3f} {r['up']:>8.3f} {r['ready']:>10.3f} "
            f"{r['total']:>10.3f} {r['worst']:>10.3f} {ratio_t:>12} {ratio_l:>12} {worst_l:>12}"
        )
    for name in failed:
        print(f"{name:<{width}} {'failed (see above)':>30}")
    print(
        "(vs launcher: a cell against notebook_launcher in a cell of the same scenario, the "
        "rest against notebook_launcher; first: the first run's total, not in the median; "
        "worst: the slowest counted run's total, and it against the launcher's median)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


def _stop_pools(pool_dir: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jupyterlab_mlcluster.jobs import warm

    for sock in pool_dir.glob("zygote-*.sock"):
        try:
            warm.request(sock, {"op": "stop"}, timeout=2)
        except Exception:  # noqa: BLE001 - already gone
            pass


if __name__ == "__main__":
    sys.exit(main())
