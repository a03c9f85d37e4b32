"""Execute a notebook headlessly (nbclient, a real kernel) and print what its cells output.

python examples/run_notebook.py examples/quickstart.ipynb [--save executed.ipynb]
"""

from __future__ import annotations

import argparse
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def text_of(output) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join(output.traceback)
    data = output.get("data", {})
    return data.get("text/plain", "") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("notebook")
    parser.add_argument("--save", help="write the executed notebook here")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3")
    started = time.monotonic()
    status = 0
    try:
        client.execute()
    except CellExecutionError as exc:
        print(exc, file=sys.stderr)
        status = 1
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        first = cell.source.splitlines()[0] if cell.source else ""
        print(f"--- In [{index}]: {first}")
        for output in cell.get("outputs", []):
            sys.stdout.write(text_of(output))
    print(f"--- executed {args.notebook} in {time.monotonic() - started:.1f}s")
    if args.save:
        nbformat.write(nb, args.save)
    return status


if __name__ == "__main__":
    sys.exit(main())
