"""Rank 1 raises ValueError while rank 0 waits in a barrier (it then fails too, with gloo's
"Connection closed by peer"): the job's cause is rank 1's error.

CULPRIT_FREEZE=1 makes the race that used to name rank 0 certain, under any launcher: rank 1
stops its parent (the supervisor, or torchrun's agent) with SIGSTOP before it raises, and a
helper of rank 0's resumes it only once both ranks have exited, so the launcher looks at two
failed ranks at once, rank 0's follow-on error the lower rank number of the two.
`@record` writes each rank's error file (with its time), as torchrun's docs ask: torchrun
then names the first failure by time too."""

import os
import signal
import subprocess
import sys

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

# Resumes the launcher once both ranks are gone (zombies nobody reaped yet, or reaped).
HELPER = """
import os, signal, sys, time, psutil
launcher, pids = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
deadline = time.monotonic() + 60
while not all(gone(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.01)
os.kill(launcher, signal.SIGCONT)
"""


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    freeze = os.environ.get("CULPRIT_FREEZE") == "1"
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    if rank == 0 and freeze:
        subprocess.Popen(
            [sys.executable, "-c", HELPER, str(os.getppid()), *map(str, pids)],
            start_new_session=True,  # not stopped with the rank's group
            stdin=subprocess.DEVNULL,
        )
    dist.barrier()
    if rank == 1:
        if freeze:
            os.kill(os.getppid(), signal.SIGSTOP)
        raise ValueError("rank 1 broke")
    dist.barrier()  # rank 0 waits here until rank 1's connections close


if __name__ == "__main__":
    main()
