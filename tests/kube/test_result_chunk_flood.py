"""A Kubernetes job's rank 0 floods its supervisor with result chunks that hold no bytes
(issue 31). Rank 0 holds the job's signing key, so its records are genuine; the supervisor,
on the shared server, must still hold no more of them than a result within the job's cap
has chunks. Before, a chunk's bytes were counted but not the chunk: two million empty ones
grew the supervisor by 163 MiB. Now a sending's chunk 0 fixes how many chunks it has (at
most what `max_result_mib` allows), a chunk past that number refuses the result, and each
chunk held counts for more than its bytes.
"""

from __future__ import annotations

import psutil
from helpers import job_processes, wait_for

from tests.kube.jobs_fixtures import code, log_text, spec_of
from tests.kube.player import objects_of

FLOOD = 150_000  # empty chunks per attack: about 12 MiB of the supervisor's memory before

# Rank 0 says it is ready, waits, sends FLOOD signed empty chunks (`index` and `count` pick
# the attack), says so, waits, then returns a value.
CELL = """
import os, time
from jupyterlab_mlcluster.runtime import reporting

def wait(name):
    while not os.path.exists(os.path.join({gate!r}, name)):
        time.sleep(0.05)

print("ready", flush=True)
wait("go")
for i in range({flood}):
    reporting.send({{"type": "result", "index": {index}, "count": {count}, "data": ""}})
print("flooded", flush=True)
wait("end")
"done"
"""


def _rss(service, job_id: str) -> int:
    supervisor = service.store.get_job(job_id).supervisor
    assert supervisor and job_processes(service, job_id)
    return psutil.Process(supervisor["pid"]).memory_info().rss


def _flood(service, player, tmp_path, name: str, index: str, count: int) -> tuple[object, int]:
    """Run one attack; (the job's final record, the supervisor's growth in bytes)."""
    gate = tmp_path / name
    gate.mkdir()
    cell = CELL.format(gate=str(gate), flood=FLOOD, index=index, count=count)
    record = service.submit(spec_of(workers=1), code(cell))
    (pod,) = player.create_pods(player.resumed(record.id)).values()
    player.schedule(pod)
    run = player.run_rank(pod)

    def said(word: str) -> bool:
        return f"0:{word}" in log_text(service, record.id)

    wait_for(lambda: said("ready"), timeout=120, message="rank 0 ready")
    before = _rss(service, record.id)
    (gate / "go").touch()
    wait_for(lambda: said("flooded"), timeout=300, message="the flood read by the supervisor")
    grown = _rss(service, record.id) - before
    (gate / "end").touch()
    assert player.end_rank(run) == 0, run.text
    player.finish_job(player.job_object(record.id), succeeded=True)
    return service.wait(record.id, timeout=120), grown


def test_attack_empty_result_chunks_do_not_grow_the_supervisor(
    k8s, player, kube, kube_namespace, tmp_path
):
    service = k8s()
    # A count no result within max_result_mib (1024 MiB: 29 128 chunks) has.
    final, grown = _flood(service, player, tmp_path, "count", "i", FLOOD + 1)
    print(f"supervisor growth over {FLOOD} empty chunks, count {FLOOD + 1}: {grown} bytes")
    assert grown < 4 << 20, grown
    assert final.state == "failed", final
    assert "MLClusterConfig.max_result_mib" in final.error, final.error
    # A chunk 0 saying three chunks, then chunk 2, 3, 4, ... (never chunk 1: never complete).
    final, grown = _flood(service, player, tmp_path, "index", "i and i + 1", 3)
    print(f"supervisor growth over {FLOOD} empty chunks past chunk 0's count: {grown} bytes")
    assert grown < 4 << 20, grown
    assert final.state == "failed", final
    assert "chunks disagree on their number" in final.error, final.error
    for job in service.store.list_jobs()[0]:
        assert not service.store.result_path(job.id).exists()
        assert objects_of(kube, kube_namespace, job.id) == {}
