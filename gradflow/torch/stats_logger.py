# stats_logger.py — StatsLogger: writes gradflow's communication counters as
# TensorBoard scalars from rank 0 (torch.utils.tensorboard). Owns only when
# to write and where; the scalars come from gradflow/stats_scalars.py.
"""TensorBoard monitoring of gradflow for PyTorch training loops."""
from __future__ import annotations

from typing import Any, Dict, Optional

from .._runtime import rank
from ..stats_scalars import StatsDelta

__all__ = ["StatsLogger"]


class StatsLogger:
    """Call :meth:`step` once per training step (after ``optimizer.step()``);
    every `every` steps rank 0 writes gradflow's counters for the interval
    as TensorBoard scalars (see :mod:`gradflow.stats_scalars` for the list,
    e.g. ``gradflow/bytes_sent_per_step``, ``gradflow/comm_fraction``).

    Other ranks write nothing and communicate nothing (``step`` costs them
    one counter increment), so calling it on every rank is safe.

    log_dir: the TensorBoard run directory (rank 0 opens a
      ``torch.utils.tensorboard.SummaryWriter`` there; needs the
      ``tensorboard`` package). writer: an existing SummaryWriter (e.g. the
      one your own scalars go to) instead of log_dir; it is not closed here.
    """

    def __init__(self, log_dir: Optional[str] = None, writer: Any = None, every: int = 1,
                 prefix: str = "gradflow/") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"gradflow: StatsLogger every must be an int >= 1, got {every!r}")
        if (log_dir is None) == (writer is None) and rank() == 0:
            raise ValueError("gradflow: StatsLogger needs exactly one of log_dir or writer")
        self.every = every
        self._steps = 0          # steps since start
        self._pending = 0        # steps since the last write
        self._writer, self._own_writer = None, False
        self._delta: Optional[StatsDelta] = None
        if rank() == 0:
            if writer is None:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as e:  # torch raises this when tensorboard is absent
                    raise ImportError("gradflow: StatsLogger needs the tensorboard package "
                                      "(pip install tensorboard)") from e
                writer, self._own_writer = SummaryWriter(log_dir=log_dir), True
            self._writer = writer
            self._delta = StatsDelta(prefix)

    def step(self, global_step: Optional[int] = None) -> Dict[str, float]:
        """Count one training step; on rank 0, every `every` steps, write
        and return the scalars (averaged over the interval), else return {}.
        global_step: the x-axis value (default: steps counted by this logger)."""
        self._steps += 1
        self._pending += 1
        if self._writer is None or self._pending < self.every:
            return {}
        x = self._steps if global_step is None else int(global_step)
        scalars = self._delta.take(self._pending)
        self._pending = 0
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, x)
        self._writer.flush()
        return scalars

    def close(self) -> None:
        """Flush, and close the writer this logger opened."""
        if self._writer is not None:
            self._writer.flush()
            if self._own_writer:
                self._writer.close()
            self._writer = None

    def __enter__(self) -> "StatsLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
