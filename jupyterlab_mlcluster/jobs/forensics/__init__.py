"""Forensics of a job's ranks: their stacks on demand (`stacks.py` the data and its folds,
`readers.py` py-spy or the rank's own helper, `kept.py` what a job keeps), and the stall
watch (`stall.py`; `job_stall.py` declares it on the job; `attempt.py`, what every
backend's attempt forensics share). Backends hand stacks over through
`Backend.collect_stacks`; the local one reads its ranks' processes here."""

from .attempt import AttemptForensics
from .job_stall import JobStall
from .kept import keep, kept
from .readers import (
    NATIVE_UNAVAILABLE,
    ReadFailed,
    StacksUnavailable,
    Target,
    helper_file,
    read_targets,
)
from .stacks import (
    Fold,
    Frame,
    NoStacks,
    NoSuchRank,
    RankStacks,
    StackReport,
    ThreadStack,
    fold,
    fold_lines,
    format_report,
    summarize,
    where_text,
)
from .stall import StallWatch

__all__ = [
    "NATIVE_UNAVAILABLE",
    "AttemptForensics",
    "Fold",
    "JobStall",
    "Frame",
    "NoStacks",
    "NoSuchRank",
    "RankStacks",
    "ReadFailed",
    "StackReport",
    "StacksUnavailable",
    "StallWatch",
    "Target",
    "ThreadStack",
    "fold",
    "fold_lines",
    "format_report",
    "helper_file",
    "keep",
    "kept",
    "read_targets",
    "summarize",
    "where_text",
]
