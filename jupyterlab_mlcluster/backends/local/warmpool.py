"""Warm pool: a CUDA-clean zygote that has imported the heavy modules (placeholder)."""

from __future__ import annotations

_IN_ZYGOTE_CHILD = False


def in_zygote_child() -> bool:
    return _IN_ZYGOTE_CHILD


def become_rank(env, cwd, payload_path) -> int:
    raise NotImplementedError
