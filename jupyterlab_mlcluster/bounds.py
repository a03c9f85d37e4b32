"""The numeric bounds of a job's options: one definition each.

The REST API's document (`server/openapi.yaml`) names them with `x-bounds: <name>`, and the
loader puts in the schema's `minimum` (or `exclusiveMinimum`) and `maximum`; the job model
(`jobs/model.py`) checks every front end's options (magic, CLI, Python API, REST) against the
same objects, before anything is written. Like `patterns.py`, plain Python, so the engine
(`jobs/`) imports them without parsing the document.

Why bound at all: an out-of-range number must be a clear error naming the option, never an
OverflowError from SQLite (64-bit integers) or a float overflow after the job directory was
written. The maxima are generous ceilings, not policy (MLClusterConfig.max_workers is).
"""

from __future__ import annotations

import dataclasses
import decimal


@dataclasses.dataclass(frozen=True)
class Bound:
    minimum: int | float
    maximum: int | float
    exclusive_minimum: bool = False  # the value must be greater than `minimum`

    def contains(self, value: float | decimal.Decimal) -> bool:
        above = value > self.minimum if self.exclusive_minimum else value >= self.minimum
        return above and value <= self.maximum

    def describe(self) -> str:
        """'at least 1 and at most 64', 'greater than 0 and at most 1000000'."""
        low = "greater than" if self.exclusive_minimum else "at least"
        return f"{low} {self.minimum} and at most {self.maximum}"

    def schema(self) -> dict[str, int | float]:
        """The JSON Schema keywords of this bound."""
        low = "exclusiveMinimum" if self.exclusive_minimum else "minimum"
        return {low: self.minimum, "maximum": self.maximum}


# Ranks of one job: a ceiling for every backend; a server's document says its own
# MLClusterConfig.max_workers when that is lower.
WORKERS = Bound(1, 65536)
GPUS_PER_WORKER = Bound(0, 1024)
# CPU slots (local) or cores (Kubernetes) per rank.
CPUS = Bound(0, 1_000_000, exclusive_minimum=True)
# Bytes of memory per rank: 4 EiB, well inside SQLite's 64-bit integers.
MEMORY = Bound(1, 2**62)
# Seconds until the job is failed: about 31 years.
TIMEOUT = Bound(0, 1_000_000_000, exclusive_minimum=True)
MAX_RESTARTS = Bound(0, 1000)
# Seconds without output, progress or CPU before a rank is flagged stalled; 0: never.
STALL_AFTER = Bound(0, 1_000_000_000)
# A 32-bit signed integer, like Kubernetes' PriorityClass value.
PRIORITY = Bound(-(2**31), 2**31 - 1)

# The names the API document uses in `x-bounds`.
BY_NAME: dict[str, Bound] = {
    "workers": WORKERS,
    "gpus_per_worker": GPUS_PER_WORKER,
    "cpus": CPUS,
    "memory": MEMORY,
    "timeout": TIMEOUT,
    "max_restarts": MAX_RESTARTS,
    "stall_after": STALL_AFTER,
    "priority": PRIORITY,
}
