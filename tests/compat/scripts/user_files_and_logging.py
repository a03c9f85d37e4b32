"""Issue 30's report, unchanged under every launcher: the script opens 8 files and writes
USER DATA to each, then a library logs a warning (no logging configured: Python's last
resort prints it on stderr); then the script configures logging itself and logs to its own
file.

Usage: user_files_and_logging.py OUTDIR
"""

import logging
import os
import sys

out, rank = sys.argv[1], os.environ["RANK"]
files = [open(os.path.join(out, f"user-{rank}-{i}.txt"), "w") for i in range(8)]
for f in files:
    f.write("USER DATA\n")
    f.flush()
logging.getLogger("mylib").warning("library warning on rank %s", rank)
for f in files:
    f.close()

logging.basicConfig(
    filename=os.path.join(out, f"own-log-{rank}.txt"),
    level=logging.INFO,
    format="%(levelname)s %(name)s: %(message)s",
)
logging.getLogger("mylib").info("the user's own logging on rank %s", rank)
