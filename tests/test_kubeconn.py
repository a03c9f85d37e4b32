"""kubeconn's pure parts: the backoff policy, what is retried, the one error form, counted logs."""

from __future__ import annotations

import logging
import random

import pytest

from jupyterlab_mlcluster import kubeconn
from jupyterlab_mlcluster.kubeconn import Backoff, ClusterUnavailable, FailureLog, KubeError


def test_backoff_is_full_jitter_exponential_capped_and_obeys_retry_after():
    random.seed(7)
    policy = Backoff(first=0.5, cap=60.0)
    for attempt in range(40):
        ceiling = min(60.0, 0.5 * 2**attempt)
        delays = [policy.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # the whole range is used (full jitter)
    assert all(policy.delay(0, retry_after=3) >= 3 for _ in range(100))
    assert policy.delay(0, retry_after=10_000) == 60.0  # a server's wish is capped too


def test_equal_jitter_waits_between_half_and_all_of_a_doubling_capped_ceiling():
    """The floor the supervisor's full-disk retries, the schedulers and the Kueue/Volcano
    views use: never an immediate retry; kubeconn's name is the floor module's class."""
    from jupyterlab_mlcluster.jobs.backoff import Backoff as FloorBackoff

    assert Backoff is FloorBackoff
    policy = Backoff(first=0.1, cap=2.0, floor=0.5)
    assert [policy.ceiling(n) for n in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert policy.ceiling(10**6) == 2.0  # no overflow for a long outage's attempt count
    rng = random.Random(20261126)
    for attempt in range(12):
        ceiling = policy.ceiling(attempt)
        delays = [policy.delay(attempt, rng=rng) for _ in range(300)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempt, min(delays))
        assert min(delays) < ceiling * 0.6 and max(delays) > ceiling * 0.9  # spread over it
    # Retry-After lifts a wait above the ceiling, never above the cap.
    assert all(policy.delay(0, retry_after=1.5, rng=rng) >= 1.5 for _ in range(50))
    assert policy.delay(0, retry_after=3600, rng=rng) == 2.0
    # A caller's seeded generator makes its waits reproducible.
    again = [policy.delay(n, rng=random.Random(5)) for n in range(8)]
    assert again == [policy.delay(n, rng=random.Random(5)) for n in range(8)]


def test_the_policy_can_be_scaled_for_tests_but_keeps_its_shape(monkeypatch):
    monkeypatch.setenv("MLCLUSTER_KUBE_BACKOFF", "0.2,2")
    assert kubeconn.backoff_from_env() == Backoff(first=0.2, cap=2.0)
    monkeypatch.setenv("MLCLUSTER_KUBE_BACKOFF", "nonsense")
    assert kubeconn.backoff_from_env() == Backoff()


@pytest.mark.parametrize(
    ("status", "reason", "retried"),
    [
        (429, "TooManyRequests", True),
        (500, "InternalError", True),
        (503, "ServiceUnavailable", True),
        (409, "Conflict", True),
        (409, "AlreadyExists", False),
        (404, "NotFound", False),
        (403, "Forbidden", False),
        (422, "Invalid", False),
    ],
)
def test_what_is_retried(status, reason, retried):
    error = kubeconn.refused(status, {"reason": reason, "message": "m"})
    assert kubeconn.retryable(error) is retried


def test_unreachable_is_retried_and_not_configured_is_not():
    assert kubeconn.retryable(kubeconn.unreachable("http://x", ConnectionRefusedError(111, "no")))
    assert not kubeconn.retryable(ClusterUnavailable(f"{kubeconn.NO_CLUSTER}: none"))
    assert not kubeconn.retryable(ValueError("a bug, not the network"))


def test_one_message_form():
    refused_ = kubeconn.refused(
        403, b'{"reason": "Forbidden", "message": "nope"}', {"Retry-After": "4"}
    )
    assert str(refused_) == "the Kubernetes API refused the request: 403 nope"
    assert (refused_.status, refused_.reason, refused_.message, refused_.retry_after) == (
        403,
        "Forbidden",
        "nope",
        4.0,
    )
    cause = ConnectionRefusedError(111, "Connection refused")
    wrapper = OSError("HTTPConnection(host=...) at 0x7f...: Failed to establish")
    wrapper.__cause__ = cause
    gone = kubeconn.unreachable("http://127.0.0.1:1", wrapper)
    assert str(gone) == (
        "the Kubernetes API server at http://127.0.0.1:1 cannot be reached: "
        "[Errno 111] Connection refused"
    )
    assert isinstance(gone, KubeError) and gone.status is None


def test_a_repeated_failure_is_logged_once_then_counted(caplog):
    clock = [1000.0]
    failures = FailureLog(logging.getLogger("test.kubeconn"), every=60.0, clock=lambda: clock[0])
    error = KubeError("API unreachable")
    with caplog.at_level(logging.WARNING, logger="test.kubeconn"):
        for _ in range(37):
            failures.failed("watching pods", error)
            clock[0] += 1.0
        failures.failed("watching pods", error)  # 37 s later: still quiet
        clock[0] += 30.0
        failures.failed("watching pods", error)  # past a minute: one line with the count
    assert [r.getMessage() for r in caplog.records] == [
        "watching pods: API unreachable",
        "watching pods: API unreachable (x39 in 67s)",
    ]


def test_kopf_style_repeats_pass_once_then_say_how_many_were_dropped():
    """kopf logs every failed attempt of every watch ("Request attempt #3/9 failed ... GET
    .../pods?resourceVersion=1015"): one line a kind (numbers ignored) a minute, counted."""
    clock = [1000.0]
    limit = kubeconn.RepeatFilter(prefix="kopf.", every=60.0, clock=lambda: clock[0])

    def record(name: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, message, None, None)

    def attempt(n: int, path: str) -> logging.LogRecord:
        return record("kopf._cogs.clients.watching", f"Request attempt #{n}/9 failed: GET {path}")

    passed = []
    for n in range(1, 10):
        for path in ("/api/v1/pods?resourceVersion=1015", "/api/v1/services?resourceVersion=7"):
            if limit.filter(r := attempt(n, path)):
                passed.append(r.getMessage())
        clock[0] += 5.0
    assert passed == [  # one a kind in the first minute
        "Request attempt #1/9 failed: GET /api/v1/pods?resourceVersion=1015",
        "Request attempt #1/9 failed: GET /api/v1/services?resourceVersion=7",
    ]
    clock[0] += 30.0
    last = attempt(10, "/api/v1/pods?resourceVersion=1016")
    assert limit.filter(last)
    assert last.getMessage().endswith("(and 8 more like it in 75s)")
    # Others' loggers, and below WARNING, are never limited.
    ours = record("notebook_controller", "Request attempt #1/9 failed: GET /x")
    assert limit.filter(ours) and limit.filter(ours)
    debug = record("kopf.objects", "Request attempt #1/9", logging.DEBUG)
    assert limit.filter(debug) and limit.filter(debug)


def test_a_backoff_schedule_draws_capped_jittered_waits_anew_each_time():
    schedule = kubeconn.BackoffSchedule(Backoff(first=0.5, cap=60.0), attempts=8)
    first, second = list(schedule), list(schedule)
    assert len(schedule) == len(first) == 8
    assert all(0 <= wait <= min(60.0, 0.5 * 2**n) for n, wait in enumerate(first))
    assert first != second  # jitter: two requests never retry in step


def test_call_tells_on_retry_of_each_retried_failure_only():
    told: list[BaseException] = []
    outcomes = [KubeError("busy", status=503), KubeError("slow down", status=429), "done"]

    def action():
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    result = kubeconn.call(action, "GET /x", sleep=lambda _: None, on_retry=told.append)
    assert result == "done" and [e.status for e in told] == [503, 429]
    told.clear()
    with pytest.raises(KubeError):  # not retryable: raised, not counted
        kubeconn.call(
            lambda: (_ for _ in ()).throw(KubeError("no", status=403)),
            "GET /y",
            sleep=lambda _: None,
            on_retry=told.append,
        )
    assert told == []


def test_calls_sharing_an_in_flight_limit_wait_their_turn(tmp_path, monkeypatch):
    """A fleet's thousand jobs call the API through connections sharing one limit: however
    many threads call at once, the server sees at most that many calls open (the rest wait
    in the client, their timeout not counting); without it, all of them."""
    import http.server
    import json
    import threading

    from tests.kube.emulator import kubeconfig as emulator_kubeconfig

    open_now = {"now": 0, "most": 0, "hold_until": 0}
    lock = threading.Condition()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                open_now["now"] += 1
                open_now["most"] = max(open_now["most"], open_now["now"])
                lock.notify_all()
                # Held open until that many have been open at once (or a moment, when none
                # is asked for: calls overlap if they can).
                wanted = open_now["hold_until"]
                if wanted:
                    lock.wait_for(lambda: open_now["most"] >= wanted, timeout=30)
                else:
                    lock.wait(0.05)
            body = json.dumps({"kind": "Status", "ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            with lock:
                open_now["now"] -= 1

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 64  # (the default 5 drops a burst's connects: SYN retries)

    server = Server(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(emulator_kubeconfig(f"http://127.0.0.1:{server.server_port}")))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    def most_open(limit: int | None, hold_until: int = 0) -> int:
        conn = kubeconn.connect(namespace="ns", pool_size=64)
        if limit is not None:
            conn.in_flight = threading.BoundedSemaphore(limit)
        open_now["most"], open_now["hold_until"] = 0, hold_until
        answers: list[object] = []

        def call() -> None:
            try:
                answers.append(conn.request("GET", "/api/v1/namespaces/ns/pods/p"))
            except Exception as exc:  # noqa: BLE001 - reported below
                answers.append(exc)

        callers = [threading.Thread(target=call) for _ in range(24)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(60)
        conn.close()
        assert answers == [{"kind": "Status", "ok": True}] * 24, answers
        return open_now["most"]

    try:
        assert most_open(limit=4) <= 4
        # The same calls unlimited, each held until 5 are open: they all get there.
        assert most_open(limit=None, hold_until=5) >= 5
    finally:
        server.shutdown()
