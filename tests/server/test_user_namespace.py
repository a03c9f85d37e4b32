"""User -> namespace (server/user_namespace.py): a fixed table, collisions, Profiles."""

from __future__ import annotations

import re

import pytest

from jupyterlab_mlcluster.server.user_namespace import (
    BadTemplate,
    NamespaceTaken,
    check_template,
    dns_label,
    profile_namespace,
    template_namespace,
    user_namespace,
)

LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
HASHED = re.compile(r"(^|-)[0-9a-f]{16}$")


def profile(name: str, owner: str, kind: str = "User", **metadata) -> dict:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Profile",
        "metadata": {"name": name, **metadata},
        "spec": {"owner": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": owner}},
    }


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("alice", "mlcluster-alice"),
        ("a-b-x", "mlcluster-a-b-x"),
        ("bob-2", "mlcluster-bob-2"),
    ],
)
def test_valid_names_are_kept(user: str, expected: str) -> None:
    assert template_namespace(user) == expected


@pytest.mark.parametrize(
    ("user", "head"),
    [
        ("a.b@x", "mlcluster-a-b-x"),
        ("Alice", "mlcluster-alice"),
        ("alice@example.com", "mlcluster-alice-example-com"),
        ("accounts.google.com:Bob_Smith", "mlcluster-accounts-google-com-bob-smith"),
        ("ünïcode", "mlcluster-n-code"),
        ("-", "mlcluster"),
    ],
)
def test_changed_names_get_a_hash_of_the_whole_name(user: str, head: str) -> None:
    namespace = template_namespace(user)
    assert LABEL.fullmatch(namespace) and len(namespace) <= 63
    assert namespace.startswith(head + "-") and HASHED.search(namespace), namespace
    assert namespace == template_namespace(user), "deterministic"


def test_long_names_are_trimmed_to_63_with_the_hash() -> None:
    long_a, long_b = "a" * 100, "a" * 99 + "b"
    ns_a, ns_b = template_namespace(long_a), template_namespace(long_b)
    assert len(ns_a) == len(ns_b) == 63 and LABEL.fullmatch(ns_a) and LABEL.fullmatch(ns_b)
    assert ns_a[:46] == ns_b[:46] and ns_a != ns_b, "same head, different hash"
    exactly = "a" * 63
    assert dns_label(exactly) == exactly, "63 valid characters fit as they are"
    assert len(dns_label("a" * 64)) == 63


@pytest.mark.parametrize(
    "names",
    [
        ["a.b@x", "a-b-x", "A-B-X", "a_b_x", "a b x", "a--b--x"],
        ["alice@example.com", "alice-example-com", "Alice@Example.com"],
        ["bob", "Bob", "BOB", "bob."],
    ],
)
def test_names_that_sanitise_alike_never_share_a_namespace(names: list[str]) -> None:
    namespaces = [template_namespace(n) for n in names]
    assert len(set(namespaces)) == len(names), dict(zip(names, namespaces, strict=True))


def test_a_valid_name_shaped_like_a_hashed_one_is_hashed_too() -> None:
    """`a.b@x` becomes `mlcluster-a-b-x-<hash>`; a user literally named `a-b-x-<that hash>`
    must not land there."""
    hashed = template_namespace("a.b@x")
    impostor = hashed.removeprefix("mlcluster-")
    assert LABEL.fullmatch(impostor)
    assert template_namespace(impostor) != hashed
    assert template_namespace(impostor).startswith(hashed + "-")


def test_attack_the_hash_suffix_is_too_short_to_search_for_a_collision() -> None:
    """Red team: the suffix was 40 bits, so a second preimage (an identity that sanitises to
    Alice's head and hashes like hers) was a search away, landing Bob in her namespace. It is
    now 64 bits (16 hex), within the 63-character limit; and a name ending like the old
    10-hex suffix still counts as hash-shaped, so nobody can claim a namespace made before
    by picking its name as an identity."""
    import hashlib

    for user in ("alice@example.com", "x" * 200, "a.b@x"):
        namespace = template_namespace(user)
        assert LABEL.fullmatch(namespace) and len(namespace) <= 63
        suffix = namespace.rsplit("-", 1)[1]
        assert len(suffix) == 16, namespace
        assert suffix == hashlib.sha256(f"mlcluster-{user}".encode()).hexdigest()[:16]
    # The namespace the first releases made for alice@example.com (10 hex of the same hash).
    legacy = (
        "mlcluster-alice-example-com-"
        + (hashlib.sha256(b"mlcluster-alice@example.com").hexdigest()[:10])
    )
    impostor = legacy.removeprefix("mlcluster-")
    assert LABEL.fullmatch(impostor)
    assert template_namespace(impostor) != legacy
    assert template_namespace(impostor).startswith(legacy + "-")


def test_the_template_must_name_user_once_and_nothing_else() -> None:
    assert check_template("team-{user}") == "team-{user}"
    for bad in ["team", "{user}-{user}", "{user}-{ns}", "{0}", "{user", "{user.__class__}"]:
        with pytest.raises(BadTemplate):
            check_template(bad)
    assert template_namespace("Alice", "ml-{user}-ns").startswith("ml-alice-ns-")
    # A user name holding braces is data, not a field.
    assert LABEL.fullmatch(template_namespace("{user}"))


def test_a_profile_the_user_owns_is_the_namespace() -> None:
    profiles = [
        profile("team-z", "alice@example.com"),
        profile("team-a", "alice@example.com"),
        profile("bobs", "bob@example.com"),
        profile("group-ns", "alice@example.com", kind="Group"),
        profile("going", "carol", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    assert profile_namespace("alice@example.com", profiles) == "team-a", "first by name"
    assert user_namespace("bob@example.com", profiles) == "bobs"
    # A Group owner is not a user; a Profile being deleted is no home; no Profile: template.
    assert profile_namespace("group-ns", profiles) is None
    assert user_namespace("carol", profiles) == "mlcluster-carol"
    assert user_namespace("dave", profiles, "x-{user}") == "x-dave"
    # Profiles not served (None): the template, even for a name a Profile would have.
    assert user_namespace("bob@example.com", None) == template_namespace("bob@example.com")
    # Owner names are compared exactly: no case folding into someone else's Profile.
    assert user_namespace("Bob@example.com", profiles) != "bobs"


def test_attack_profile_squatting_the_template_namespace_is_refused() -> None:
    """Bob registers Profile `mlcluster-alice`; Alice, who owns no Profile, would get that
    name from the template: refused (NamespaceTaken), never mapped into Bob's namespace."""
    squatted = [profile("mlcluster-alice", "bob")]
    with pytest.raises(NamespaceTaken) as taken:
        user_namespace("alice", squatted)
    assert "mlcluster-alice" in str(taken.value) and "does not own" in str(taken.value)
    # Bob's own name maps to his own Profile if he has one; others are not affected.
    assert user_namespace("carol", squatted) == "mlcluster-carol"
    # A Profile of her own wins over the squatted template name.
    assert user_namespace("alice", [*squatted, profile("alices", "alice")]) == "alices"


def test_attack_a_forged_ready_profile_does_not_beat_the_namespaces_owner() -> None:
    """Red team of issue 31, F5: Bob's Profile `alice-team`, its status forged to Ready (where
    the CRD has no status subresource or users may write profiles/status), on a Namespace
    Kubeflow made for Alice (`owner: alice`): the Ready shortcut mapped Bob there and made
    him its owner. A Profile's status is no evidence; the Namespace's marks decide."""
    from jupyterlab_mlcluster.notebook_resource import profile_dispute
    from notebook_controller.namespaces import namespace_owner

    forged = {
        **profile("alice-team", "bob@example.com"),
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    alices = {"metadata": {"name": "alice-team", "annotations": {"owner": "alice@example.com"}}}
    why = profile_dispute(forged, alices) or ""
    assert "'owner' annotation names 'alice@example.com'" in why
    with pytest.raises(NamespaceTaken):
        user_namespace("bob@example.com", [forged], namespaces={"alice-team": alices})
    assert namespace_owner(alices, forged) is None
    # Nor on a Namespace with no owner mark at all: nobody adopted it for Bob.
    bare = {"metadata": {"name": "alice-team"}}
    assert "no 'owner' annotation" in (profile_dispute(forged, bare) or "")
    assert namespace_owner(bare, forged) is None
    # The same Profile on a Namespace Kubeflow made for Bob is his, Ready or not.
    bobs = {"metadata": {"name": "alice-team", "annotations": {"owner": "bob@example.com"}}}
    assert profile_dispute(forged, bobs) is None
    assert user_namespace("bob@example.com", [forged], namespaces={"alice-team": bobs}) == (
        "alice-team"
    )
