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

from ..notebook_resource import profile_dispute, profile_owner

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


def _owned_by(user: str, profiles: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(
        (p for p in profiles if profile_owner(p) == user), key=lambda p: p["metadata"]["name"]
    )


def profile_namespace(
    user: str,
    profiles: Iterable[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, Any] | None] | None = None,
) -> str | None:
    """The namespace of a Profile `user` owns and its Namespace agrees to
    (notebook_resource.profile_dispute; the first by name if several), or None.

    `namespaces`: the Namespace of each Profile's name (None where it does not exist); not
    given, every Profile counts (pure tests of the naming alone)."""
    for profile in _owned_by(user, profiles):
        name = profile["metadata"]["name"]
        if namespaces is None or profile_dispute(profile, namespaces.get(name)) is None:
            return str(name)
    return None


def namespaces_to_read(
    user: str, profiles: Iterable[Mapping[str, Any]], template: str = DEFAULT_TEMPLATE
) -> list[str]:
    """The Namespaces `user_namespace` needs to judge `user`'s Profiles: those of the
    Profiles the user owns, and the template's, if it is the name of a Profile."""
    listed = list(profiles)
    names = [str(p["metadata"]["name"]) for p in _owned_by(user, listed)]
    namespace = template_namespace(user, template)
    if any(p["metadata"]["name"] == namespace for p in listed):
        names.append(namespace)
    return names


def user_namespace(
    user: str,
    profiles: Iterable[Mapping[str, Any]] | None,
    template: str = DEFAULT_TEMPLATE,
    namespaces: Mapping[str, Mapping[str, Any] | None] | None = None,
) -> str:
    """`profiles`: the cluster's Profiles, or None where the Profile CRD is not served;
    `namespaces`: the Namespaces named in `namespaces_to_read` (None: missing).

    A user maps to a Profile by owning it, and only when its Namespace agrees: Bob's Profile
    named after Alice's existing namespace is refused to Bob (NamespaceTaken, saying why) and
    leaves Alice where she was. The template's namespace, where that is the name of a
    Profile someone else owns that counts or will (its namespace not made yet: Bob
    registered `mlcluster-alice` before Alice had one), is refused: NamespaceTaken."""
    listed = list(profiles) if profiles is not None else None
    if listed is not None:
        owned = profile_namespace(user, listed, namespaces)
        if owned:
            return owned
        disputes = [
            profile_dispute(p, (namespaces or {}).get(p["metadata"]["name"]))
            for p in _owned_by(user, listed)
        ]
        if disputes:
            raise NamespaceTaken(
                f"no namespace is yours through your Profiles: {'; '.join(filter(None, disputes))}"
                ". Ask your administrator for a Profile whose namespace is yours"
            )
    namespace = template_namespace(user, template)
    for profile in listed or []:
        if profile["metadata"]["name"] != namespace:
            continue
        existing = (namespaces or {}).get(namespace)
        # Only a Namespace that says it is not the Profile's leaves it to the template.
        if (
            existing is None
            or profile_owner(profile) is None
            or not profile_dispute(profile, existing)
        ):
            raise NamespaceTaken(
                f"your namespace {namespace!r} (MLClusterApp.user_namespace_template) is a "
                f"Profile that {user!r} does not own, so nothing of yours is put there: ask "
                "your administrator for a Profile of your own (spec.owner: your identity)"
            )
    return namespace
