"""Rank 0's result as it arrives in signed chunks over its pod log: held within the job's
caps, written to the job's directory once complete, or refused saying why. One
`ResultAssembler` per Kubernetes attempt (supervise.py), and one per session cell
(session.py): each cell's result is its own."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from ...runtime.atomic import write_whole
from ...runtime.outcome import RESULT_CHUNK

if TYPE_CHECKING:
    from ...jobs.running.supervisor import JobContext

# What each chunk held counts for besides its data: an empty chunk is not free (a dict entry,
# its index, its string; about 100 bytes), so its count is what bounds how many are held.
CHUNK_ENTRY = 64


class ResultAssembler:
    """Rank 0's result in chunks for the job of `ctx`: the pickle (its owner's kernel reads
    it) and its JSON form (what servers serve); neither is ever loaded here. More than the
    job's result cap is dropped as it comes (a pod cannot fill this process's memory) and
    fails the job. A sending's chunk 0 fixes how many chunks it has (at most what the cap
    allows, at the runtime's RESULT_CHUNK each); a chunk past that number, or saying
    another, refuses the result, and a chunk before any chunk 0 is dropped: what is held
    stays within the count, empty chunks included."""

    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.chunks: dict[str, dict[int, str]] = {}  # form -> index -> base64
        self.counts: dict[str, int] = {}  # form -> chunks its chunk 0 announced
        self.received = 0  # base64 characters of result chunks held (and CHUNK_ENTRY each)
        self.json_refused = False  # rank 0's JSON form was over max_result_json_mib
        self.refused: str | None = None  # why rank 0's result was dropped (fails the job)

    @property
    def incomplete(self) -> bool:
        """Some chunks arrived and the rest did not."""
        return bool(self.chunks)

    def take(self, record: dict[str, Any]) -> None:
        """One signed `result` record of rank 0."""
        if self.refused:
            return
        form = "json" if record.get("form") == "json" else "pickle"
        if form == "json" and self.json_refused:
            return
        try:
            index, count = int(record["index"]), int(record["count"])
            data = str(record["data"])
        except (KeyError, TypeError, ValueError):
            return
        config = self.ctx.config
        cap = (config.max_result_json_mib if form == "json" else config.max_result_mib) << 20
        if index == 0 and count != self.counts.get(form):
            # A sending starts with its chunk 0 (a restarted rank 0 sends its result again).
            self._forget(form)
            self.counts[form] = count
        expected = self.counts.get(form)
        if expected is None:
            return
        if count != expected or not 0 <= index < count:
            why = (
                f"its chunks disagree on their number (chunk {index} of {count}, after a "
                f"chunk 0 of {expected})"
            )
            self._refuse(form, why)
            return
        if cap and count > -(-(cap * 4 // 3 + 4) // RESULT_CHUNK):
            self._over_cap(form)
            return
        chunks = self.chunks.setdefault(form, {})
        previous = chunks.get(index)
        self.received += len(data) + (CHUNK_ENTRY if previous is None else -len(previous))
        chunks[index] = data
        if form == "json" and cap:
            held_json = sum(len(c) + CHUNK_ENTRY for c in chunks.values())
            if held_json > cap * 4 // 3 + 4:
                self._over_cap(form)
                return
        limit = config.max_result_mib << 20
        # base64 is 4/3 of the bytes; the JSON form may be as big as the pickle.
        if limit and self.received > 2 * (limit * 4 // 3 + 4):
            self._over_cap("pickle")
            return
        if len(chunks) == count:  # every index below count: each was checked as it came
            result = base64.b64decode("".join(chunks[i] for i in range(count)))
            store = self.ctx.store
            path = store.result_json_path if form == "json" else store.result_path
            write_whole(path(self.ctx.job.id), result)
            self._forget(form)

    def _forget(self, form: str) -> None:
        chunks = self.chunks.pop(form, {})
        self.received -= sum(len(c) + CHUNK_ENTRY for c in chunks.values())
        self.counts.pop(form, None)

    def _over_cap(self, form: str) -> None:
        config = self.ctx.config
        if form == "json":
            # The JSON form is what servers read and serve, for everyone: it is kept small
            # whatever the rank says of itself. The job and its pickle go on.
            why = (
                "its JSON form is more than this job's supervisor keeps "
                f"({config.max_result_json_mib} MiB, MLClusterConfig.max_result_json_mib)"
            )
        else:
            why = (
                f"rank 0's result is more than this job may return "
                f"({config.max_result_mib} MiB, MLClusterConfig.max_result_mib): save "
                "it to a file instead"
            )
        self._refuse(form, why)

    def _refuse(self, form: str, why: str) -> None:
        """Drop what is held of the result (the JSON form alone: the job goes on; the
        pickle: the job fails saying why)."""
        if form == "json":
            self._forget(form)
            self.json_refused = True
            self.ctx.logs.system(f"[mlcluster] rank 0's result: {why}", rank=0)
            write_whole(
                self.ctx.store.result_json_path(self.ctx.job.id),
                json.dumps({"kind": "refused", "refused": why}).encode(),
            )
            return
        for held in list(self.chunks):
            self._forget(held)
        self.refused = why if why.startswith("rank 0") else f"rank 0's result: {why}"
        self.ctx.logs.system(f"[mlcluster] {self.refused}", rank=0)
