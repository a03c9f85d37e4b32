"""What a job's code reports reaches the monitor's HTML as text only (issue 31): its progress
(`mlc.progress`, or a signed record sent by hand with any value in any field) is written
into the kernel's display. Before, the step and total went in unescaped: a total of
`<img src=x onerror=...>` ran in the notebook of whoever watched the job. A real kernel,
real ranks.
"""

from __future__ import annotations

import re

from jupyterlab_mlcluster.jobs import lifecycle

PAYLOADS = ("<img src=x onerror=alert(1)>", "<script>alert(2)</script>", "<b>9</b>")

CELL = """%%distributed --workers 2
import time, jupyterlab_mlcluster as mlc
from jupyterlab_mlcluster.runtime import reporting
mlc.progress(1, 10, desc={script!r})
time.sleep(0.3)
reporting.send({{"type": "progress", "step": 3, "total": {img!r}, "desc": {script!r},
                 "unit": {bold!r}}})
reporting.send({{"type": "progress", "step": {bold!r}, "total": 10, "desc": "plain"}})
reporting.send({{"type": "progress", "step": 4, "total": {img!r}, "desc": {script!r},
                 "unit": {bold!r}}})
time.sleep(0.5)
"""


def test_attack_progress_values_reach_the_monitor_as_text_only(kernel):
    img, script, bold = PAYLOADS
    msgs, reply = kernel.execute(CELL.format(img=img, script=script, bold=bold))
    assert reply["status"] == "ok", reply
    shown = []
    for m in msgs:
        if m["msg_type"] == "comm_msg":
            shown.append(m["content"]["data"].get("state", {}).get("value", ""))
        elif m["msg_type"] in ("display_data", "update_display_data", "comm_open"):
            data = m["content"]["data"]
            shown.append(data.get("text/html", "") or data.get("state", {}).get("value", ""))
    html = "\n".join(s for s in shown if isinstance(s, str))
    assert "data-rank='0'" in html, html[:2000]  # the rank table was shown
    for payload in PAYLOADS:
        assert payload not in html, payload
    assert not re.search(r"<(img|script)\b", html), html
    # The description is shown, as text.
    assert "&lt;script&gt;alert(2)&lt;/script&gt; 4" in html, html[-3000:]


def test_a_progress_report_keeps_numbers_and_short_text_only():
    cleaned = lifecycle.clean_progress(
        {"step": "<b>9</b>", "total": float("nan"), "desc": "x" * 10_000, "unit": "<i>"}
    )
    assert cleaned == {"step": None, "total": None, "desc": "x" * lifecycle.PROGRESS_DESC_MAX}
    assert lifecycle.clean_progress({"step": 3, "total": 10.5, "desc": None}) == {
        "step": 3,
        "total": 10.5,
        "desc": None,
    }
    assert lifecycle.clean_progress({"step": True, "desc": 7})["step"] is None
