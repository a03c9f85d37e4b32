"""The text patterns several layers check: one definition each.

The REST API's document (`server/openapi.yaml`) names them with `x-pattern: <name>`, and the
loader puts the regex in as the schema's `pattern`; the job model (`jobs/model.py`), the job
store, the notebook controller's builders and the CRD compile the same strings here. They are
plain strings, not read from the YAML file, so that the engine (`jobs/`), the
supervisor started for every job and the in-cluster controller import them without parsing
a document or reaching up into `server/`.

Every pattern is anchored (`^...$`) and written in the common subset of ECMA-262 (what JSON
Schema and the browser use) and Python's `re`; `regex()` compiles one with ECMA's meaning of
`$` (the very end, so "name\\n" does not pass).
"""

from __future__ import annotations

import functools
import re
import string
from typing import Any

# A job's name: it names Kubernetes objects (with a suffix), so a DNS label of at most 53.
JOB_NAME = r"^[a-z0-9]([a-z0-9-]{0,51}[a-z0-9])?$"
# A job's id, as jobs/record.py's new_job_id makes them.
JOB_ID = r"^j[0-9a-f]{10}$"
# What `{id}` in a job URL may be: a job id ("j3fa9c21b0") or a job name.
JOB_REF = r"^[a-z0-9][a-z0-9-]{0,62}$"
# An environment variable a job sets on its ranks.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A Python identifier in ASCII (the variables a job pulls from rank 0).
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A notebook server's name: a DNS-1035 label of at most 52 characters, leaving room for '-0'
# and the controller-revision-hash label of its pod.
NOTEBOOK_NAME = r"^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$"
# A namespace: a DNS-1123 label (at most 63 characters).
NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# One user's identity as the identity header carries it (a Notebook's spec.owner): visible
# ASCII without '*' (Istio's wildcard: `*` admits everyone, `a*` everyone starting with "a"),
# whitespace, ',' or ';' (lists), quotes or backslashes. At most 253 characters.
IDENTITY = r"^[A-Za-z0-9._@+:/=~!#$%&|?^{}-]{1,253}$"
# Kubernetes quantities as the notebook builder accepts them.
CPU_QUANTITY = r"^[0-9]+(\.[0-9]+)?m?$"
MEMORY_QUANTITY = r"^[0-9]+(\.[0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# A notebook's persistent workspace size (the CRD's rule).
WORKSPACE_SIZE = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"

# A sweep's id ("s" and ten hex digits, jobs/experiments/sweep.py).
SWEEP_ID = r"^s[0-9a-f]{10}$"
# A schedule's name: its runs are named <schedule>-YYYYMMDDHHMM, a job name of at most 53.
SCHEDULE_NAME = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
# A session's name (`%%distributed --session NAME`): its gang's job has that name.
SESSION_NAME = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"

# A TensorBoard directory template (jobs/model.py parse_tensorboard_dir): an absolute path,
# or a URI with no white space, with `{job}` as the only placeholder ({{ and }} for braces).
TENSORBOARD_DIR = (
    r"^(/([^\u0000-\u001f\u007f{}]|\{job\}|\{\{|\}\})*"
    r"|[a-z][a-z0-9+.-]*://([^\s\u0000-\u001f\u007f{}]|\{job\}|\{\{|\}\})+)$"
)

# A job's timeout as text: seconds ("45", "0.5"), or parts with units in falling order, each
# unit at most once and each part above zero ("90s", "30m", "1h30m", "2d", "500ms"). Every
# text it admits lies within the timeout's bounds (bounds.TIMEOUT: above 0, at most 1e9 s):
# seconds have at most nine whole digits (or are 1e9 itself) and a part at most four, so the
# longest, "9999.999999d9999.999999h...", is 9.0e8 s. The API document therefore admits
# exactly the texts the job model accepts.
_ABOVE_ZERO = r"0\.0{0,5}[1-9][0-9]{0,5}"
_DURATION_UNITS = ("d", "h", "m", "s", "ms")
_PART = rf"(?:[1-9][0-9]{{0,3}}(?:\.[0-9]{{1,6}})?|{_ABOVE_ZERO})"
DURATION = (
    rf"^(?:[1-9][0-9]{{0,8}}(?:\.[0-9]{{1,6}})?|1000000000(?:\.0{{1,6}})?|{_ABOVE_ZERO}|"
    + "|".join(
        f"{_PART}{unit}" + "".join(f"(?:{_PART}{later})?" for later in _DURATION_UNITS[i + 1 :])
        for i, unit in enumerate(_DURATION_UNITS)
    )
    + ")$"
)

# A logged series' name (`mlc.log(loss=...)`, a Trainer's "train/loss", a TensorBoard tag):
# printable, no comma (`GET /jobs/{id}/metrics?series=a,b` lists them), at most 200 characters.
SERIES_NAME = r"^[^,\u0000-\u001f\u007f]{1,200}$"
SERIES_LIST = r"^[^,\u0000-\u001f\u007f]{1,200}(,[^,\u0000-\u001f\u007f]{1,200}){0,49}$"

# The names the API document uses in `x-pattern`.
BY_NAME: dict[str, str] = {
    "job_name": JOB_NAME,
    "job_ref": JOB_REF,
    "env_name": ENV_NAME,
    "identifier": IDENTIFIER,
    "notebook_name": NOTEBOOK_NAME,
    "namespace": NAMESPACE,
    "cpu_quantity": CPU_QUANTITY,
    "memory_quantity": MEMORY_QUANTITY,
    "workspace_size": WORKSPACE_SIZE,
    "sweep_id": SWEEP_ID,
    "schedule_name": SCHEDULE_NAME,
    "session_name": SESSION_NAME,
    "tensorboard_dir": TENSORBOARD_DIR,
    "duration": DURATION,
    "series_name": SERIES_NAME,
    "series_list": SERIES_LIST,
}


@functools.lru_cache(maxsize=256)
def regex(pattern: str) -> re.Pattern[str]:
    """`pattern` compiled for Python with JSON Schema's meaning: a final `$` is the very end
    (Python's `$` also matches before a trailing newline)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def matches(pattern: str, text: str) -> bool:
    return regex(pattern).search(text) is not None


# -- a TensorBoard directory template (the job option and MLClusterConfig.tensorboard_dir) --

_URI_RE = re.compile(r"[a-z][a-z0-9+.-]*://\S+")


def tensorboard_dir_problem(value: Any, option: str = "tensorboard") -> str | None:
    """What is wrong with a TensorBoard directory template (None: nothing): it must be an
    absolute path or a URI TensorBoard reads (s3://, gs://, hdfs://), optionally with `{job}`
    (the job id). Here, below both its users: the job model raises SpecError with it, the
    engine's settings a TraitError."""
    example = "an absolute path or a URI such as 's3://bucket/runs/{job}'"
    if not isinstance(value, str):
        return f"{option} must be {example}, got {value!r}"
    text = value.strip()
    if not text or len(text) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in text):
        return f"{option} must be {example}, got {value!r}"
    if not (text.startswith("/") or _URI_RE.fullmatch(text)):
        return f"{option} must be {example} (ranks may run elsewhere), got {value!r}"
    try:
        fields = [
            (name, spec, conv)
            for _, name, spec, conv in string.Formatter().parse(text)
            if name is not None
        ]
    except ValueError:
        fields = [("", None, None)]
    if any(name != "job" or spec or conv for name, spec, conv in fields):
        return (
            f"{option} may only use the placeholder {{job}} (write {{{{ }}}} for a brace), "
            f"got {value!r}"
        )
    return None
