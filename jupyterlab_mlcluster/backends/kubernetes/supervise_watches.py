"""What a Kubernetes attempt's supervisor knows of its job object and pods (supervise.py's
`_Attempt`): `AttemptWatches` lists and watches them (kubeconn's list-then-watch threads:
the job object by name, the job's pods by label) and puts each change on the attempt's
event queue; `ClusterView` is what those events last said.

The events are plain tuples, so any source may put them: ("job", obj), ("job_deleted", obj),
("job_list", items), the same three for "pod", and ("watch_error", "job" | "pod", exc). A
source watching many jobs' objects at once (one list-watch selected by the label every job's
objects carry) would put each job's share on that job's queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import kubeconn
from .client import Connection, Kind, kind_of, message_of
from .names import label_value
from .objects import job_selector

if TYPE_CHECKING:
    from .shared_watches import SharedCluster

log = logging.getLogger("jupyterlab_mlcluster.supervisor")
WATCH_FAILURES = kubeconn.FailureLog(log)  # an outage: one line, then a count a minute

Event = tuple[Any, ...]


def _ended(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class ClusterView:
    """The attempt's job object (only the one with the attempt's `uid`: a same-named one of
    another attempt is not it) and the job's pods, by name, as the events said last.

    A pod that had ended when it was deleted is kept apart, in `ended`: Kubernetes lets an
    evicted pod go right after it reports Failed, and both changes can arrive in one batch,
    so the pod that was taken away must still be judged (else its peer's exit on the same
    SIGTERM would be blamed)."""

    def __init__(self) -> None:
        self.uid: str | None = None
        self.job: dict[str, Any] | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, dict[str, Any]] = {}  # deleted after they ended

    def judged_pods(self) -> list[dict[str, Any]]:
        """The pods an outcome is judged on: those alive in the API, and those deleted after
        they ended (a newer pod for the same rank wins, by its creation time)."""
        return [*(p for n, p in self.ended.items() if n not in self.pods), *self.pods.values()]

    def _gone(self, name: str, last: dict[str, Any] | None) -> None:
        if last is not None and _ended(last):
            self.ended[name] = last

    @property
    def empty(self) -> bool:
        """Neither the job object nor any pod is left."""
        return self.job is None and not self.pods

    def take(self, event: Event) -> bool:
        """Apply a watch's event; whether it was one."""
        what, value = event[0], event[1]
        if what == "job":
            if value["metadata"].get("uid") == self.uid:
                self.job = value
        elif what == "job_deleted":
            if value["metadata"].get("uid") == self.uid:
                self.job = None
        elif what == "pod":
            self.pods[value["metadata"]["name"]] = value
        elif what == "pod_deleted":
            name = value["metadata"]["name"]
            self._gone(name, value if _ended(value) else self.pods.get(name))
            self.pods.pop(name, None)
        elif what == "job_list":  # a (re)list: what is not in it is gone
            mine = [o for o in value if o["metadata"].get("uid") == self.uid]
            self.job = mine[0] if mine else None
        elif what == "pod_list":
            listed = {o["metadata"]["name"]: o for o in value}
            for name in self.pods.keys() - listed.keys():
                self._gone(name, self.pods[name])
            self.pods = listed
        else:
            return False
        return True


class AttemptWatches:
    """Two list-then-watch threads (kubeconn's: reconnects wait the one backoff policy, an
    outage is logged once with a count) over job `job_id`'s object (`kind`, named `name`)
    and pods in `namespace`, feeding `events`. `say(text)`: a line in the job's log (each
    distinct watch failure once). In a fleet (`shared`), no threads of its own: its share of
    the fleet's list-watches (shared_watches.py)."""

    def __init__(
        self,
        conn: Connection,
        namespace: str,
        kind: Kind,
        name: str,
        job_id: str,
        events: queue.Queue[Event],
        say: Callable[[str], None],
        shared: SharedCluster | None = None,
    ):
        self.conn, self.namespace, self.events, self.say = conn, namespace, events, say
        self.kind, self.label, self.shared = kind, label_value(job_id), shared
        self.subscribed = False
        self.sources = (
            ("job", kind, {"fieldSelector": f"metadata.name={name}"}),
            ("pod", kind_of("v1", "Pod"), {"labelSelector": job_selector(job_id)}),
        )
        self.threads: list[tuple[kubeconn.ListWatch, threading.Thread]] = []
        self.stopping = threading.Event()
        self.reported: set[str] = set()  # watch failures said in the job's log

    @property
    def started(self) -> bool:
        return bool(self.threads) or self.subscribed

    def _shared_sources(self) -> list[Any]:
        assert self.shared is not None
        return [
            self.shared.source(self.conn, self.namespace, self.kind, "job"),
            self.shared.pods(self.conn, self.namespace),
        ]

    def start(self) -> None:
        if self.shared is not None:
            for source in self._shared_sources():
                source.subscribe(self.label, self.events)
            self.subscribed = True
            return
        put = self.events.put
        for name, kind, query in self.sources:
            watch = kubeconn.ConnectionListWatch(
                self.conn,
                kind.path(self.namespace),
                query,
                f"the job's {name}s",
                lambda items, n=name: put((f"{n}_list", items)),
                lambda change, obj, n=name: put(
                    (f"{n}_deleted" if change == "DELETED" else n, obj)
                ),
                self.stopping,
                failures=WATCH_FAILURES,
                on_error=lambda exc, n=name: put(("watch_error", n, exc)),
            )
            thread = threading.Thread(target=watch.run, name=f"watch-{name}s", daemon=True)
            thread.start()
            self.threads.append((watch, thread))

    def failed(self, what: str, exc: BaseException) -> None:
        """A ("watch_error", what, exc) event: said once per distinct failure."""
        text = message_of(exc)
        if text not in self.reported:
            self.reported.add(text)
            self.say(f"[mlcluster] watching the job's {what}s failed ({text}); retrying")

    def stop(self) -> None:
        if self.subscribed:
            for source in self._shared_sources():
                source.unsubscribe(self.label, self.events)
            self.subscribed = False
        if self.threads:
            self.stopping.set()
            for watch, _ in self.threads:
                watch.interrupt()
            for _, thread in self.threads:
                thread.join(5)
