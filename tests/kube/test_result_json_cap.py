"""A Kubernetes job's rank 0 sends a JSON form of its result bigger than servers serve.

The rank's own cap (runtime/outcome.JSON_FORM_MAX) is the job author's to change: his code
runs in that process and holds the job's signing key. The supervisor, on the server's side,
keeps at most MLClusterConfig.max_result_json_mib of the JSON form whatever the rank says:
past it the chunks are dropped as they come, the job still succeeds with its pickle (for
its owner's kernel), and a server's read says why there is no JSON form.
"""

from __future__ import annotations

import pytest

from jupyterlab_mlcluster.jobs.service import NoJSONForm
from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.player import objects_of

# Bob lifts his rank's own cap on the JSON form, then returns 3 MiB of text.
LIFTED = """
import gc
for f in gc.get_objects():
    if getattr(f, "__name__", None) == "result_json" and "JSON_FORM_MAX" in getattr(f, "__globals__", {}):
        f.__globals__["JSON_FORM_MAX"] = 1 << 40
"A" * (3 << 20)
"""


def test_attack_a_json_form_over_the_cap_is_dropped_by_the_supervisor(
    k8s, player, kube, kube_namespace
):
    service = k8s(max_result_json_mib=1)
    record = service.submit(spec_of(workers=1), code(LIFTED))
    player.resumed(record.id)
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    # The pickle is kept (its owner's kernel reads it); the JSON form is not.
    assert service.result(record.id) == ("value", "A" * (3 << 20))
    stored = service.store.result_json_path(record.id)
    assert stored.stat().st_size < 4096, stored.stat().st_size
    with pytest.raises(NoJSONForm, match="MLClusterConfig.max_result_json_mib"):
        service.result_data(record.id)
    assert objects_of(kube, kube_namespace, record.id) == {}
