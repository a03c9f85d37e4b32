"""Who owns a job submitted from this process (the kernel's magic, the CLI, the Python API).

In a notebook pod the process runs as the image's Unix user (`jovyan` for everyone), not as
the person whose notebook it is: the notebook-controller puts the Notebook's owner
(`spec.owner`, the identity a header-trusting server scopes its routes by) in `$MLCLUSTER_USER`
of the pod, so jobs a kernel or the CLI submits there show under that identity. Elsewhere, the
Unix user. (REST submissions name their caller themselves.) No import beyond the standard
library: the notebook-controller uses the name too.
"""

from __future__ import annotations

import getpass
import os

USER_ENV = "MLCLUSTER_USER"


def current_user() -> str:
    named = os.environ.get(USER_ENV, "").strip()
    if named:
        return named
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return str(os.getuid())
