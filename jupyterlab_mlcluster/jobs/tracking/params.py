"""What of a job is an experiment's parameters: its options, and the scalars pushed with it
(a sweep trial's parameters are pushed too). Written at submit (`params.json` in the job's
directory) so that no one unpickles the payload to learn them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PARAMS_FILE = "params.json"
MAX_VALUE = 500  # characters of a parameter's value (MLflow keeps 6000; a long one says little)


def pushed_scalars(push: dict[str, Any]) -> dict[str, Any]:
    """The pushed variables that are plain scalars (numbers, text, booleans)."""
    out: dict[str, Any] = {}
    for name, value in push.items():
        if isinstance(value, bool | int | str) or (
            isinstance(value, float) and math.isfinite(value)
        ):
            out[name] = value if not isinstance(value, str) else value[:MAX_VALUE]
    return out


def params_file(push: dict[str, Any]) -> bytes:
    return json.dumps({"pushed": pushed_scalars(push)}).encode()


def job_params(job_dir: Path, spec: dict[str, Any]) -> dict[str, str]:
    """The run's params: each option set and each pushed scalar. Environment variables by
    name only: their values may be credentials, and a tracker is read by a whole team."""
    params: dict[str, str] = {}
    for key, value in spec.items():
        if value is None or key == "env":
            continue
        params[key] = str(value)[:MAX_VALUE]
    if spec.get("env"):
        params["env"] = ",".join(sorted(spec["env"]))[:MAX_VALUE]
    try:
        pushed = json.loads((job_dir / PARAMS_FILE).read_text()).get("pushed", {})
    except (OSError, ValueError, AttributeError):
        pushed = {}
    for name, value in pushed.items():
        params[f"pushed.{name}"] = str(value)[:MAX_VALUE]
    return params
