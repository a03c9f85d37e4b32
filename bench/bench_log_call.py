"""What one `mlc.log` call costs a rank, in CPU time: a bound on what logging every step can
take from steps/s that a loaded machine does not blur (bench_monitor's log-on/log-off pair
measures steps/s itself, and is only as steady as the machine).

    python bench/bench_log_call.py [--calls 200000]

The rank side is set up as in a job (a signed channel on a pipe, drained by a thread as the
supervisor would); each call logs two scalars. The step is bench_monitor's (a small MLP,
one rank, CPU): the share is the call's CPU time over the step's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path


def channel() -> None:
    """A job's report channel for this process: its key beside a payload, a pipe drained."""
    from jupyterlab_mlcluster.runtime import reporting
    from jupyterlab_mlcluster.runtime.protocol import KEY_FILE, new_key_file

    folder = Path(tempfile.mkdtemp())
    new_key_file(folder / KEY_FILE)
    read, write = os.pipe()
    os.environ.update(MLCLUSTER_PAYLOAD=str(folder / "payload.pkl"), MLCLUSTER_REPORT=f"fd:{write}")
    reporting.configure(rank=0)

    def drain() -> None:
        while os.read(read, 1 << 20):
            pass

    threading.Thread(target=drain, daemon=True).start()


def step_seconds(steps: int = 300) -> float:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    for i in range(steps + 20):
        if i == 20:
            start = time.process_time()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return (time.process_time() - start) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    channel()
    import jupyterlab_mlcluster as mlc

    for i in range(1000):  # warm: the flusher thread started, the first records sent
        mlc.log(loss=1.0 / (i + 1), lr=0.01)
    start = time.process_time()  # the whole process: the flusher thread's work counts
    for i in range(args.calls):
        mlc.log(loss=1.0 / (i + 1), lr=0.01)
    from jupyterlab_mlcluster.runtime import scalars

    scalars.flush()
    per_call = (time.process_time() - start) / args.calls
    step = step_seconds()
    print(
        f"mlc.log: {per_call * 1e6:.2f} µs CPU a call ({args.calls} calls, 2 scalars each, "
        f"batched and sent); bench_monitor's step: {step * 1e6:.0f} µs CPU; "
        f"logging every step: {per_call / step * 100:.3f}% of a step"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
