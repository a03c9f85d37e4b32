"""The warm pool: a CUDA-clean zygote that has already imported the heavy modules.

Starting a rank cold costs a Python start plus `import torch` (seconds); accelerate's
notebook_launcher avoids that by forking the notebook kernel, which breaks once CUDA has
been initialised there. The zygote gives both: it is a separate, single-threaded process
that imports torch (and friends) but never touches CUDA, and it forks on request.

    submitter --(unix socket: spawn_supervisor)--> zygote --fork--> supervisor --fork--> ranks

The forked supervisor forks the ranks itself (it is still single-threaded and
CUDA-clean), so ranks are its real children: exit statuses, PR_SET_PDEATHSIG and
process groups work exactly as for cold ranks. Each rank then gets its own environment
(CUDA_VISIBLE_DEVICES before any CUDA use), fresh random seeds, and its own stdio.

One zygote per environment fingerprint (interpreter, import-relevant variables, installed
packages): installing a package changes site-packages' mtime, hence the fingerprint, hence
the zygote; a stale one notices and exits. An unused zygote exits after an idle timeout.

Trust: the submitter sends its whole environment (tokens, cloud keys) to the zygote, so the
socket must be this user's and nobody else's. It lives in a directory this user owns with
mode 0700, checked with lstat (owner, mode, not a link) before every use:
$MLCLUSTER_WARM_POOL_DIR when set, else $XDG_RUNTIME_DIR/mlcluster, $TMPDIR/mlcluster-<uid>,
~/.cache/jupyterlab-mlcluster/warm-pool, the first that passes. One that fails is never
used nor touched (someone else may have made it); with none, jobs start cold and a warning
says why. Files in it are opened with O_NOFOLLOW; both ends check the other's uid
(SO_PEERCRED) before a word is said.

The package, by seam:
  environment.py  what a warm rank cannot see differently (start-up variables, what the
                  preloads read at import, stale_variables)
  place.py        the pool's place and identity: its directory's safety, a generation's
                  fingerprint, its socket
  client.py       talking to zygotes: request, ensure_zygote, the generations, status, stop
  serving.py      which generation serves a job: the memory budget, preparing a generation
                  for a job's values, learning ahead, spawn_supervisor
  zygote.py       the zygote server and the supervisor it forks (`python -m` entry)
  rank.py         the child side: a fork turning into a rank like a cold one
  preload.py      what the pool may learn (pure)

This module re-exports what the rest of the package calls (`warm.ensure_zygote(...)`).
"""

from __future__ import annotations

from .client import (
    REQUEST_TIMEOUT,
    START_TIMEOUT,
    ensure_zygote,
    pool_status,
    refused_modules,
    request,
    requested_modules,
    status,
    stop,
)
from .environment import REAPPLIED, STARTUP_NAMES, STARTUP_PREFIXES, stale_variables
from .place import (
    UnsafePoolDir,
    dir_problem,
    env_fingerprint,
    fingerprint,
    peer_uid,
    pool_dir,
    socket_path,
)
from .serving import learn_ahead, serving_generation, spawn_supervisor
from .zygote import SELF_CHECK_INTERVAL, in_zygote_child, preparing_note

__all__ = [
    "REAPPLIED",
    "REQUEST_TIMEOUT",
    "SELF_CHECK_INTERVAL",
    "STARTUP_NAMES",
    "STARTUP_PREFIXES",
    "START_TIMEOUT",
    "UnsafePoolDir",
    "dir_problem",
    "ensure_zygote",
    "env_fingerprint",
    "fingerprint",
    "in_zygote_child",
    "learn_ahead",
    "peer_uid",
    "pool_dir",
    "pool_status",
    "preparing_note",
    "refused_modules",
    "request",
    "requested_modules",
    "serving_generation",
    "socket_path",
    "spawn_supervisor",
    "stale_variables",
    "status",
    "stop",
]
