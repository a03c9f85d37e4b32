"""A probe run unchanged under torchrun and `mlcluster run` (cold and warm ranks): it records
what a rank can observe of its interpreter, and leaves work for the interpreter's shutdown.

Usage: probe_fresh.py OUTDIR TAG [args...]; exits with $PROBE_EXIT (default 0).
"""

import atexit
import json
import os
import signal
import sys
import threading
import time

out, tag = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "?")
stem = os.path.join(out, f"{tag}-{rank}")

import probe_sibling

ENV_KEYS = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "CUDA_VISIBLE_DEVICES",
]


def handler_name(signum):
    h = signal.getsignal(signum)
    return getattr(h, "__name__", str(h))


seen = {
    "argv": sys.argv,
    "argv0": os.path.abspath(sys.argv[0]),
    "path": sys.path,
    "sibling": probe_sibling.NAME,
    "main_file": os.path.abspath(__file__),
    "name": __name__,
    "signals": {
        s.name: handler_name(s)
        for s in (
            signal.SIGINT,
            signal.SIGTERM,
            signal.SIGPIPE,
            signal.SIGHUP,
            signal.SIGUSR1,
            signal.SIGCHLD,
        )
    },
    "threads": threading.active_count(),
    "env": {k: os.environ.get(k) for k in ENV_KEYS},
}
with open(stem + ".json", "w") as f:
    json.dump(seen, f)

atexit.register(lambda: open(stem + ".atexit", "w").write("ran"))


def late_writer():
    time.sleep(0.3)
    with open(stem + ".thread", "w") as f:
        f.write("joined")


threading.Thread(target=late_writer).start()  # non-daemon: the interpreter waits for it
unclosed = open(stem + ".unclosed", "w")  # never closed: its buffer is flushed at exit
unclosed.write("kept")
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
