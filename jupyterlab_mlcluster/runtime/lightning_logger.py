"""`mlc.LightningLogger`: a Lightning logger whose metrics (`self.log(...)` in a
LightningModule) become the job's series, at Lightning's step:

    trainer = L.Trainer(logger=mlc.LightningLogger(), ...)

Each rank sends its own points (Lightning calls loggers on every process). Hyperparameters
are not series: they are left to the job's options (and MLflow's params with --track).
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.loggers.logger import Logger as _Base
except ImportError:  # the older package name
    from pytorch_lightning.loggers.logger import Logger as _Base  # type: ignore[assignment]

from .scalars import finite, log


class LightningLogger(_Base):
    @property
    def name(self) -> str:
        return "mlcluster"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        numbers = {k: v for k, v in metrics.items() if finite(v) is not None}
        if numbers:
            log(step=step, **numbers)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass
