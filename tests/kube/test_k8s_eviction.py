"""A pod's eviction costs no work (issue 33, item 5), against the API emulator with the ranks
run for real (ClusterPlayer): the README's example (examples/dcp_resume.py, as it is) trains
in two pods; one is evicted (DisruptionTarget, SIGTERM, the pod's
terminationGracePeriodSeconds, which is the job's grace); the ranks save a
torch.distributed.checkpoint at the step they are at, `--max-restarts` creates the job
again, and its ranks resume at that very step. The attempt's reason is the eviction.
"""

from __future__ import annotations

import re
import socket

from helpers import REPO, WAIT_SCALE, wait_for

from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.player import objects_of

EXAMPLE = REPO / "examples" / "dcp_resume.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pods(player, job) -> dict:
    """The attempt's pods placed and their containers started (rendezvous on a free port:
    pod DNS names and the default port are not ours here)."""
    port = str(free_port())
    pods = player.create_pods(job)
    for pod in pods.values():
        player.schedule(pod)
    return {
        rank: player.run_rank(pod, extra_env={"MASTER_PORT": port}) for rank, pod in pods.items()
    }


def test_an_evicted_pod_saves_on_sigterm_and_the_new_gang_resumes_at_that_step(
    k8s, player, kube, kube_namespace, tmp_path
):
    # (a generous grace: on a loaded two-core machine a rank's interpreter takes seconds to
    # shut down after its save, and SIGKILL would make the exit status a lie)
    service = k8s(kill_grace_period=90)
    env = {
        "CKPT_DIR": str(tmp_path / "ckpt"),
        "STEPS": "30",
        "CKPT_EVERY": "1000",  # no periodic checkpoint: only SIGTERM's
        "STEP_SECONDS": "0.2",
    }
    record = service.submit(spec_of(workers=2, max_restarts=1, env=env), code(EXAMPLE.read_text()))
    first = player.resumed(record.id)
    assert first["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 90
    runs = run_pods(player, first)
    wait_for(lambda: "attempt 0: starting at step 0" in runs[0].text, 90, message="the ranks train")
    assert player.evict(runs[1]) == 143  # it saved, then exited as SIGTERM asks
    assert (
        player.end_rank(runs[0], 120 * WAIT_SCALE) == 143
    )  # its peer saved with it (the flag is all-reduced)

    def recreated():
        job = player.job_object(record.id)
        return job if job["metadata"]["uid"] != first["metadata"]["uid"] else None

    second = wait_for(recreated, timeout=60, message="the second attempt")
    assert second["metadata"]["annotations"]["mlcluster.io/attempt"] == "1"
    restarted = service.store.get_job(record.id)
    (ended,) = restarted.attempts
    assert ended["reason"] == "rank 1's pod was evicted (Eviction API): Eviction API: evicting"
    assert (ended["outcome"], ended["restarted"], ended["failed_rank"]) == ("failed", True, None)

    runs = run_pods(player, second)
    codes = {rank: player.end_rank(run, 120 * WAIT_SCALE) for rank, run in runs.items()}
    assert codes == {0: 0, 1: 0}, runs[0].text
    player.finish_job(second, succeeded=True)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", final.error
    lines = [item["line"] for item in service.logs(record.id, 0)[0]]
    saved = [
        m.group(1) for line in lines if (m := re.fullmatch(r"SIGTERM: saved step (\d+).*", line))
    ]
    assert len(saved) == 1 and 0 < int(saved[0]) < 30, lines
    assert f"attempt 1: starting at step {saved[0]}" in lines  # nothing lost
    assert service.result(record.id)[1]["step"] == 30
    assert [a["outcome"] for a in final.attempts] == ["failed", "succeeded"]
    assert objects_of(kube, kube_namespace, record.id) == {}
