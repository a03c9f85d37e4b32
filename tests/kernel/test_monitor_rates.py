"""What the kernel sends for a job whose ranks print flat out: bounded by time, not by how
much they print (the kernel shares the machine with the ranks; bench/bench_monitor.py)."""

from __future__ import annotations

import math

from jupyterlab_mlcluster.kernel import monitor
from jupyterlab_mlcluster.kernel.monitor import RankOutputs


def test_hot_ranks_output_is_sent_at_most_once_per_interval_then_whole_at_the_end(capsys):
    outputs = RankOutputs(workers=4)
    tick, seconds = 0.05, 10.0
    sent = {rank: 0 for rank in range(4)}
    published_lines = 0
    for i in range(int(seconds / tick)):
        now = i * tick
        # every rank prints 20 lines per tick (400 lines/s each)
        outputs.add([{"rank": r, "line": f"step {i}.{k}"} for r in range(4) for k in range(20)])
        for rank in outputs.flush("j1", now=now):
            sent[rank] += 1
            published_lines += len(outputs.lines[rank])
    final = outputs.flush("j1", force=True, now=seconds)
    capsys.readouterr()  # outside a kernel, IPython's display prints: not the point here
    bound = math.ceil(seconds / monitor.RANK_OUTPUT_INTERVAL) + 1
    assert all(1 <= count <= bound for count in sent.values()), sent
    assert final == {0, 1, 2, 3}  # whatever came after the last timed send goes out at the end
    assert not outputs.dirty
    # The tabs of the widget view keep their own account: nothing was shown there yet.
    assert outputs.dirty_tabs == {0, 1, 2, 3}


def test_a_quiet_rank_is_never_resent(capsys):
    outputs = RankOutputs(workers=2)
    outputs.add([{"rank": 0, "line": "hello"}])
    assert outputs.flush("j1", now=0.0) == {0}
    for i in range(1, 100):
        assert outputs.flush("j1", now=i * 0.25) == set()
    capsys.readouterr()
