"""User -> namespace: where one user's notebook servers live (pure functions).

The namespace of a Kubeflow-style Profile the user owns (`kubeflow.org/v1` Profile, cluster
scoped: `spec.owner` is `{kind: User, name: <user>}` and the Profile's name is the namespace),
else a template such as `mlcluster-{user}`, made a DNS-1123 label. Making a name a label must
never let two users share a namespace: whenever it changes the name (case, characters, length),
a hash of the whole name is appended, and a name that already ends the way such a hash does
gets one too, so `a.b@x` (-> `a-b-x-<hash>`) and `a-b-x` (-> `a-b-x`) stay apart.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL = "kubeflow.org", "v1", "profiles"
DEFAULT_TEMPLATE = "mlcluster-{user}"

MAX_LABEL = 63
# 64 bits of SHA-256: a second preimage (another identity that sanitises to the same head
# and hashes alike) is out of reach; 40 bits (the first releases') was not.
_HASH_CHARS = 16
# Namespaces made before carry a 10-hex suffix: a name ending that way still counts as
# hash-shaped, so nobody can pick an identity that maps onto such an existing namespace.
_LEGACY_HASH_CHARS = 10
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_HASH_SHAPED_END = re.compile(rf"-([0-9a-f]{{{_HASH_CHARS}}}|[0-9a-f]{{{_LEGACY_HASH_CHARS}}})$")


class BadTemplate(ValueError):
    pass


class NamespaceTaken(Exception):
    """The template's namespace for a user is another user's Profile (a 403 for the caller:
    their notebooks and jobs would land where someone else rules)."""


def check_template(template: str) -> str:
    """The template, if it names `{user}` and nothing else (else BadTemplate, saying why)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise BadTemplate(f"user_namespace_template {template!r}: {exc}") from None
    if fields != ["user"]:
        raise BadTemplate(
            f"user_namespace_template {template!r} must contain '{{user}}' exactly once and no "
            "other field"
        )
    return template


def dns_label(name: str) -> str:
    """`name` if it is a DNS-1123 label that cannot be mistaken for a hashed one, else its
    sanitised form (lowercase, runs of other characters one "-", trimmed) with `-<hash of name>`."""
    if len(name) <= MAX_LABEL and _LABEL.fullmatch(name) and not _HASH_SHAPED_END.search(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_CHARS]
    head = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    head = head[: MAX_LABEL - _HASH_CHARS - 1].rstrip("-")
    return f"{head}-{digest}" if head else digest


def template_namespace(user: str, template: str = DEFAULT_TEMPLATE) -> str:
    return dns_label(check_template(template).format(user=user))


def profile_namespace(user: str, profiles: Iterable[Mapping[str, Any]]) -> str | None:
    """The namespace of a Profile `user` owns (the first by name if several), or None."""
    owned = sorted(
        p["metadata"]["name"]
        for p in profiles
        if ((p.get("spec") or {}).get("owner") or {}).get("kind") == "User"
        and ((p.get("spec") or {}).get("owner") or {}).get("name") == user
        and not p["metadata"].get("deletionTimestamp")
    )
    return owned[0] if owned else None


def user_namespace(
    user: str,
    profiles: Iterable[Mapping[str, Any]] | None,
    template: str = DEFAULT_TEMPLATE,
) -> str:
    """`profiles`: the cluster's Profiles, or None where the Profile CRD is not served.

    A user maps to a Profile only by owning it; the template's namespace, where that is the
    name of a Profile someone else owns (Bob registered `mlcluster-alice` before Alice had
    one), is refused: NamespaceTaken."""
    listed = list(profiles) if profiles is not None else None
    owned = profile_namespace(user, listed) if listed is not None else None
    if owned:
        return owned
    namespace = template_namespace(user, template)
    if listed is not None and any(p["metadata"]["name"] == namespace for p in listed):
        raise NamespaceTaken(
            f"your namespace {namespace!r} (MLClusterApp.user_namespace_template) is a Profile "
            f"that {user!r} does not own, so nothing of yours is put there: ask your "
            "administrator for a Profile of your own (spec.owner: your identity)"
        )
    return namespace
