# gradflow/keras/stats_callback.py — TensorBoardStatsCallback: writes
# gradflow's communication counters as TensorBoard scalars from rank 0 with
# tf.summary during model.fit. Owns only when to write and where; the
# scalars come from gradflow/stats_scalars.py.
"""TensorBoard monitoring of gradflow for Keras (TensorFlow backend)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import keras

from .._runtime import rank
from ..stats_scalars import StatsDelta

__all__ = ["TensorBoardStatsCallback"]


class TensorBoardStatsCallback(keras.callbacks.Callback):
    """Every `update_freq` training batches, rank 0 writes gradflow's
    counters for the interval (see :mod:`gradflow.stats_scalars`, e.g.
    ``gradflow/bytes_sent_per_step``, ``gradflow/comm_fraction``) with
    ``tf.summary.scalar`` to an event file in `log_dir` (point Keras'
    own ``TensorBoard(log_dir)`` callback or ``tensorboard --logdir`` at the
    same place). Other ranks write and communicate nothing. The x axis is
    the number of batches trained since the callback was made; `last`
    holds the scalars last written (rank 0)."""

    def __init__(self, log_dir: str, update_freq: int = 1, prefix: str = "gradflow/") -> None:
        super().__init__()
        if isinstance(update_freq, bool) or not isinstance(update_freq, int) or update_freq < 1:
            raise ValueError(f"gradflow: update_freq must be an int >= 1, got {update_freq!r}")
        self.log_dir, self.update_freq, self.prefix = str(log_dir), update_freq, prefix
        self.last: Dict[str, float] = {}
        self._steps = 0
        self._pending = 0
        self._delta: Optional[StatsDelta] = None
        self._writer: Any = None

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if rank() != 0 or self._writer is not None:
            return
        import tensorflow as tf  # tf.summary is TensorFlow's; needed on rank 0 only

        self._writer = tf.summary.create_file_writer(self.log_dir)
        self._delta = StatsDelta(self.prefix)  # count from the start of training

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._steps += 1
        self._pending += 1
        if self._writer is None or self._pending < self.update_freq:
            return
        import tensorflow as tf

        self.last = self._delta.take(self._pending)
        self._pending = 0
        with self._writer.as_default():
            for tag, value in self.last.items():
                tf.summary.scalar(tag, value, step=self._steps)
        self._writer.flush()

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        if self._writer is not None:
            self._writer.flush()
