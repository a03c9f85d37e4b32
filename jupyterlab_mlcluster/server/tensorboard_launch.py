"""One TensorBoard process as the server starts it (server/tensorboard.py), answering only
the server's proxy.

`python -m jupyterlab_mlcluster.server.tensorboard_launch` reads one JSON line on stdin:
`{"argv": TensorBoard's flags, "secret": the proxy's secret}`. Nothing of it is on the
command line: `/proc/<pid>/cmdline` (the flags named the jobs' directories and the path
prefix) and the port in `/proc/net/tcp` are every local user's to read, and TensorBoard has
no authentication of its own. Every request must carry the secret in SECRET_HEADER, which
only the proxy adds after the server's own authentication; any other gets 403 and nothing of
TensorBoard. TensorBoard's info file (`/tmp/.tensorboard-info`, readable by all, naming the
port, prefix and directories) is not written.
"""

from __future__ import annotations

import hmac
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

SECRET_HEADER = "X-MLCluster-TensorBoard-Secret"
_SECRET_KEY = "HTTP_" + SECRET_HEADER.upper().replace("-", "_")  # its name in a WSGI environ
_REFUSED = b"forbidden: this TensorBoard answers only the Jupyter server's proxy\n"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def guarded(app: WSGIApp, secret: str) -> WSGIApp:
    """`app`, answering only requests that carry `secret` in SECRET_HEADER."""
    expected = secret.encode()

    def guard(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        # WSGI hands header values over as latin-1 strings.
        given = str(environ.get(_SECRET_KEY, "")).encode("latin-1", "replace")
        if not hmac.compare_digest(given, expected):
            start_response(
                "403 Forbidden",
                [("Content-Type", "text/plain"), ("Content-Length", str(len(_REFUSED)))],
            )
            return [_REFUSED]
        return app(environ, start_response)

    return guard


def main() -> int:
    try:
        settings = json.loads(sys.stdin.readline())
        argv, secret = list(settings["argv"]), str(settings["secret"])
    except (ValueError, KeyError, TypeError) as exc:
        print(f"no settings on stdin: {exc}", file=sys.stderr, flush=True)
        return 2
    if len(secret) < 32 or not all(isinstance(a, str) for a in argv):
        print("malformed settings on stdin", file=sys.stderr, flush=True)
        return 2

    from tensorboard import default, main_lib, program

    def server(wsgi_app: WSGIApp, flags: Any) -> Any:
        return program.create_port_scanning_werkzeug_server(guarded(wsgi_app, secret), flags)

    class Unlisted(program.TensorBoard):
        def _register_info(self, server: Any) -> None:
            pass  # the info file tells every local user where it listens and what it reads

    main_lib.global_init()
    board = Unlisted(plugins=default.get_plugins(), server_class=server)
    board.configure(argv=["", *argv])
    return int(board.main() or 0)


if __name__ == "__main__":
    sys.exit(main())
