"""TensorBoard directories on a shared server (issue 22): the server reads what a job names
with its own Unix user and credentials, for everyone. Bob may name only his own area
(realpath checked), his job's own directory, or a URI under an allowed prefix; anything else
is a 400 at submit with nothing stored, and a job that names another place some other way is
refused when TensorBoard is opened (403, no TensorBoard started). A real Jupyter server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

BOB, ALICE = "bob@example.com", "alice@example.com"


@pytest.fixture
def areas(tmp_path) -> Path:
    root = tmp_path / "areas"
    for user in (BOB, ALICE):
        (root / user).mkdir(parents=True)
    (root / ALICE / "events.out.tfevents.1").write_bytes(b"alice's runs")
    return root


@pytest.fixture
def mlc_config(areas) -> dict[str, Any]:
    return {
        "MLClusterApp": {
            "trust_identity_header": True,
            "allow_local_jobs_when_shared": True,  # local jobs: no cluster needed here
            "tensorboard_user_dir": str(areas / "{user}"),
            "tensorboard_allowed_uris": ["s3://team-runs/{user}/"],
            "metrics_interval": 0,
        }
    }


async def call(jp_fetch, who: str, method: str, *path: str, body: Any = None):
    response = await jp_fetch(
        "mlcluster",
        "api",
        *path,
        method=method,
        body=json.dumps(body) if body is not None else ("" if method == "POST" else None),
        headers={"kubeflow-userid": who},
        raise_error=False,
    )
    return response.code, json.loads(response.body or b"null")


def refused_places(areas: Path, tmp_path: Path) -> list[tuple[dict[str, Any], str]]:
    (areas / BOB / "to-alice").symlink_to(areas / ALICE)
    return [
        ({"tensorboard": str(areas / ALICE)}, "tensorboard_user_dir"),
        ({"tensorboard": "/"}, "tensorboard_user_dir"),
        ({"tensorboard": str(areas / BOB / ".." / ALICE)}, "tensorboard_user_dir"),
        ({"tensorboard": str(areas / BOB / "to-alice")}, "tensorboard_user_dir"),
        ({"tensorboard": "s3://server-bucket/{job}"}, "tensorboard_allowed_uris"),
        ({"tensorboard": f"s3://team-runs/{ALICE}/x"}, "tensorboard_allowed_uris"),
        ({"tensorboard": f"s3://team-runs/{BOB}/../{ALICE}"}, "'..'"),
        ({"tensorboard": str(areas / BOB / "a,b:/etc")}, "','"),
        ({"env": {"MLCLUSTER_TENSORBOARD_DIR": str(areas / ALICE)}}, "tensorboard_user_dir"),
        ({"env": {"MLCLUSTER_TENSORBOARD_DIR": "gs://anything"}}, "tensorboard_allowed_uris"),
    ]


async def test_attack_tensorboard_dir_outside_the_callers_area_is_refused_at_submit(
    jp_fetch, mlc, areas, tmp_path
):
    for options, words in refused_places(areas, tmp_path):
        status, body = await call(jp_fetch, BOB, "POST", "jobs", body={"code": "1", **options})
        assert status == 400 and words in body["message"], (options, body)
    assert (await call(jp_fetch, BOB, "GET", "jobs"))[1]["jobs"] == []
    assert mlc.service.store.list_jobs()[0] == []
    # While his area holds a link to Alice's, naming his whole area is refused too (the
    # symlink test below); once it is gone, his own places are his: his area, a URI under
    # his prefix, his job's own directory.
    status, body = await call(
        jp_fetch, BOB, "POST", "jobs", body={"code": "1", "tensorboard": str(areas / BOB)}
    )
    assert status == 400 and "symlink" in body["message"], body
    (areas / BOB / "to-alice").unlink()
    for options in (
        {"tensorboard": str(areas / BOB / "run-{job}")},
        {"tensorboard": f"s3://team-runs/{BOB}/run-{{job}}"},
        {"env": {"MLCLUSTER_TENSORBOARD_DIR": str(areas / BOB)}},
        {},
    ):
        status, body = await call(jp_fetch, BOB, "POST", "jobs", body={"code": "1", **options})
        assert status == 201, (options, body)


async def test_attack_opening_tensorboard_on_a_place_named_elsewhere_is_refused(
    jp_fetch, mlc, areas
):
    """A job that reached the store without the REST check (a kernel's or the CLI's, or
    before the settings changed) still gets no TensorBoard on another's place."""
    import asyncio

    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    record = await asyncio.to_thread(
        mlc.service.submit,
        JobSpec.from_options({"backend": "local", "tensorboard": str(areas / ALICE)}),
        Payload(kind="code", source="1\n"),
        origin={"kind": "test", "user": BOB},
    )
    await asyncio.to_thread(mlc.service.wait, record.id, 60)
    status, body = await call(jp_fetch, BOB, "POST", "jobs", record.id, "tensorboard")
    assert status == 403 and "tensorboard_user_dir" in body["message"], body
    assert mlc.tensorboards.running == {}


def test_places_check_realpaths_and_prefixes(tmp_path):
    from jupyterlab_mlcluster.server.tensorboard import PlaceRefused, TensorBoardPlaces

    places = TensorBoardPlaces(str(tmp_path / "{user}"), ("s3://b/{user}/",))
    (tmp_path / "bob").mkdir()
    own = str(tmp_path / "store" / "j1" / "tensorboard")
    assert places.check(str(tmp_path / "bob" / "x"), "bob", own_dir=own).endswith("/bob/x")
    assert places.check(own, "bob", own_dir=own) == own
    assert places.check("s3://b/bob/r", "bob", own_dir=own) == "s3://b/bob/r"
    assert places.check("s3://srv/x", "bob", own_dir=own, default="s3://srv/x") == "s3://srv/x"
    for bad, owner in [
        ("s3://b/bobby/r", "bob"),  # a prefix is a whole path component
        (str(tmp_path / "bob"), "../bob"),  # no area for an identity that is a path
        (str(tmp_path), "bob"),
    ]:
        with pytest.raises(PlaceRefused):
            places.check(bad, owner, own_dir=own)


async def test_attack_a_symlink_inside_the_callers_area_to_anothers_is_refused(
    jp_fetch, mlc, areas
):
    """Bob's own directory passes the realpath check, but holds `steal -> alice's area`
    (or a link to another directory of his that holds one): TensorBoard would follow it and
    serve Alice's scalars. Refused when TensorBoard is opened (403 naming the link), nothing
    started; once the link is gone the same request passes the check."""
    import asyncio

    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    run = areas / BOB / "run"
    run.mkdir()
    (run / "events.out.tfevents.1").write_bytes(b"bob's runs")
    record = await asyncio.to_thread(
        mlc.service.submit,
        JobSpec.from_options({"backend": "local", "tensorboard": str(run)}),
        Payload(kind="code", source="1\n"),
        origin={"kind": "test", "user": BOB},
    )
    await asyncio.to_thread(mlc.service.wait, record.id, 60)

    direct = run / "nested" / "steal"
    direct.parent.mkdir()
    direct.symlink_to(areas / ALICE)
    hop = areas / BOB / "elsewhere"
    hop.mkdir()
    for link, leads_out in ((direct, direct), (run / "hop", hop / "steal")):
        if link != direct:
            link.symlink_to(hop)
            leads_out.symlink_to(areas / ALICE / "events.out.tfevents.1")
        status, body = await call(jp_fetch, BOB, "POST", "jobs", record.id, "tensorboard")
        assert status == 403, body
        message = body["message"]
        assert "symlink" in message and str(areas / ALICE) in message, message
        assert str(leads_out) in message, message
        assert mlc.tensorboards.running == {}
        leads_out.unlink()
    # Links that stay inside his area are his to have; the check passes (then TensorBoard
    # starts, or 503 where it is not installed: past the check either way).
    status, body = await call(jp_fetch, BOB, "POST", "jobs", record.id, "tensorboard")
    assert status in (200, 503), body
    if status == 200:
        # A link made while it runs: the next open is refused and stops the one running.
        assert list(mlc.tensorboards.running) == [record.id]
        direct.symlink_to(areas / ALICE)
        status, body = await call(jp_fetch, BOB, "POST", "jobs", record.id, "tensorboard")
        assert status == 403 and str(direct) in body["message"], body
        assert mlc.tensorboards.running == {}


def test_the_walk_for_links_is_bounded(tmp_path, monkeypatch):
    """A huge or looping tree is refused saying so, after a bounded look."""
    from jupyterlab_mlcluster.server import tensorboard
    from jupyterlab_mlcluster.server.tensorboard import PlaceRefused, TensorBoardPlaces

    places = TensorBoardPlaces(str(tmp_path / "{user}"))
    area = tmp_path / "bob"
    (area / "a").mkdir(parents=True)
    (area / "a" / "loop").symlink_to(area)  # inside the area, back to its top: walked once
    own = str(tmp_path / "store")
    assert places.check(str(area), "bob", own_dir=own) == str(area)
    monkeypatch.setattr(tensorboard, "LINK_WALK_ENTRIES", 10)
    for i in range(11):
        (area / f"f{i}").write_bytes(b"")
    with pytest.raises(PlaceRefused, match="more than 10 entries"):
        places.check(str(area), "bob", own_dir=own)
    monkeypatch.setattr(tensorboard, "LINK_WALK_ENTRIES", 1000)
    monkeypatch.setattr(tensorboard, "LINK_WALK_DEPTH", 3)
    (area / "d1" / "d2" / "d3" / "d4" / "d5").mkdir(parents=True)
    with pytest.raises(PlaceRefused, match="deeper than 3 levels"):
        places.check(str(area), "bob", own_dir=own)
