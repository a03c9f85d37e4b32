"""`mlc.TrainerCallback`: a Hugging Face `Trainer`'s logs (loss, learning rate, eval
figures) as the job's series, at the Trainer's global step:

    trainer = Trainer(model, args, ..., callbacks=[mlc.TrainerCallback()])

Every rank that logs sends its own points (the Trainer logs on each process); what is not
a number (a Trainer logs none, but callbacks of others may) is left out without a word.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback as _Base

from .scalars import finite, log


class TrainerCallback(_Base):
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        numbers = {k: v for k, v in (logs or {}).items() if finite(v) is not None}
        if numbers:
            log(step=state.global_step, **numbers)
