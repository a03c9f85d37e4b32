"""torch.distributed.elastic's `@record` on a failing entry point; the script then exits 1
itself (a common pattern), so only the error file holds the failure's root cause."""

import os
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 lost its batch")
    time.sleep(30)  # stopped when rank 1 fails


if __name__ == "__main__":
    try:
        main()
    except RuntimeError:
        sys.exit(1)
