"""A preemptible training loop: on SIGTERM each rank saves a checkpoint, which takes
CHECKPOINT_SECONDS (5 by default), says so, and exits 0. `python checkpoint_on_sigterm.py DIR`
writes DIR/ready-<rank> once its handler is set, DIR/ckpt-<rank> once the save is done."""

import os
import signal
import sys
import time

out = sys.argv[1]
rank = os.environ["RANK"]


def save_and_exit(signum, frame):
    print(f"rank {rank}: {signal.Signals(signum).name}, saving a checkpoint", flush=True)
    time.sleep(float(os.environ.get("CHECKPOINT_SECONDS", "5")))  # the save itself
    with open(os.path.join(out, f"ckpt-{rank}"), "w") as f:
        f.write("saved")
    print(f"rank {rank}: checkpoint saved", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
open(os.path.join(out, f"ready-{rank}"), "w").close()
print(f"rank {rank}: training", flush=True)
while True:
    time.sleep(0.05)
