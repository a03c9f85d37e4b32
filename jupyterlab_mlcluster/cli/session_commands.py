"""`mlcluster session|pool`: this user's live sessions (list, stop, restart, pdb on a rank)
and the warm pool of pre-started interpreters that jobs' ranks start from."""

from __future__ import annotations

import argparse
import sys

from ..presentation import session_command
from .command_line import EXIT_FAILED, Command, arg, job_service


def cmd_session(args: argparse.Namespace) -> int:
    """`mlcluster session list|stop NAME|restart NAME|debug NAME`: this user's sessions
    only."""
    if args.action == "debug":  # pdb's prompt in this terminal (jobs/session_debug.py)
        from ..jobs.owner import current_user
        from ..jobs.session_debug import debug

        def say(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        print(
            debug(
                job_service(),
                current_user(),
                args.name,
                args.rank,
                origin={"kind": "cli"},
                ask=input,
                say=say,
            )
        )
        return 0
    print(session_command(job_service(), args.action, args.name, as_json=args.json))
    return 0


def cmd_pool(args: argparse.Namespace) -> int:
    from ..config import get_config
    from ..jobs import warm

    config = get_config()
    if args.action == "start":
        if warm.ensure_zygote(config) is None:
            print(
                "mlcluster: the warm pool did not come up (see its log in the pool directory)",
                file=sys.stderr,
            )
            return EXIT_FAILED
    elif args.action == "stop":
        print("stopped" if warm.stop(config) else "no warm pool is running")
        return 0
    report = warm.pool_status(config)
    generations = report["generations"]
    if not generations:
        print(
            f"no warm pool is running (enabled: {config.warm_pool}; it starts with the first job)"
        )
        return 0
    mib = 1024 * 1024
    bound = (
        f"bound {report['max_memory'] / mib:.0f} MiB (warm_pool_max_memory)"
        if report["max_memory"]
        else "no bound"
    )
    print(
        f"warm pool: {len(generations)} generation{'s' if len(generations) != 1 else ''}, "
        f"{report['pss_bytes'] / mib:.0f} MiB PSS in all, {bound}"
    )
    for g in generations:
        size = g.get("size", 0)
        extra = size - len(g["modules"])
        modules = ", ".join(g["modules"]) or "-"
        if extra > 0:
            modules += f" (+{extra} submodules)"
        pss = f"{g['pss_bytes'] / mib:.0f} MiB PSS, " if g.get("pss_bytes") else ""
        uss = f", {g['uss_bytes'] / mib:.0f} MiB of its own (USS)" if g.get("uss_bytes") else ""
        # (names only: an env-keyed generation's values may be a token)
        keyed = f" keyed by {', '.join(sorted(g['overlay']))}" if g.get("overlay") else ""
        print(
            f"generation pid {g['pid']}{'' if g['current'] else ' (outdated environment)'}"
            f"{keyed}: modules {modules}; memory {pss}{g['rss_bytes'] / mib:.0f} MiB RSS{uss}; "
            f"CUDA initialised: {g['cuda_initialized']}; up {g['uptime']:.0f}s, "
            f"idle {g['idle']:.0f}s"
        )
    for name, reason in sorted(report["refused"].items()):
        print(f"refused: {name} ({reason})")
    return 0


COMMANDS = (
    Command(
        "session",
        "your sessions: live ranks that %%%%distributed --session cells run on",
        cmd_session,
        (
            arg("action", choices=["list", "stop", "restart", "debug"]),
            arg("name", nargs="?", help="the session (stop, restart, debug)"),
            arg("--json", action="store_true", help="list: print JSON"),
            arg(
                "--rank",
                type=int,
                default=None,
                help="debug: pdb on this rank's traceback of the last failed cell (default: the"
                " rank that failed first)",
            ),
        ),
    ),
    Command(
        "pool",
        "the warm pool of pre-started, CUDA-clean interpreters",
        cmd_pool,
        (arg("action", choices=["status", "start", "stop"], nargs="?", default="status"),),
    ),
)
