"""Elastic Keras 3 model.fit on sklearn digits under `gradflowrun --min-np ...`
(tests/parallel/test_elastic_keras.py), with gradflow.keras.elastic's
KerasState and callbacks. The same knobs and JSON log as
elastic_torch_script.py:

  ELASTIC_EPOCHS       epochs to train (default 6)
  ELASTIC_KILL         "WORKER:STEP": the worker with that gradflowrun worker id
                       SIGKILLs itself before global step STEP (first life only)
  ELASTIC_LOG          a directory: each worker appends one JSON object per line
                       (events: kill, step, reset, result) to worker-<id>.jsonl
  ELASTIC_STEP_SLEEP   seconds to sleep per step (to give a test time to act)
  ELASTIC_WAIT         "SIZE:RESETS": keep training past ELASTIC_EPOCHS (up to 200
                       epochs) until, after at least RESETS resets, the group has
                       had SIZE workers (a joiner may take a while to start)

Each epoch's samples are shuffled (seed + epoch, the same on every worker);
`state.processed` counts the samples of the epoch already trained, so a
re-formed group gives fit only the rest, split over its ranks.
"""
import hashlib
import json
import os
import signal
import sys
import time

from _tf_common import keras  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.keras as hvd  # noqa: E402
import gradflow.tensorflow.keras.elastic as elastic  # noqa: E402  (Horovod's module path)

WORKER = os.environ.get("GRADFLOW_ELASTIC_WORKER", "?")
LOG = os.environ.get("ELASTIC_LOG")
EPOCHS = int(os.environ.get("ELASTIC_EPOCHS", "6"))
KILL = os.environ.get("ELASTIC_KILL", "")
SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))
WAIT_SIZE, _, WAIT_RESETS = os.environ.get("ELASTIC_WAIT", "0:0").partition(":")
WAIT_SIZE, WAIT_RESETS = int(WAIT_SIZE), int(WAIT_RESETS or 0)
BATCH = 32  # per rank


def log(**event):
    event.update(worker=WORKER, t=time.time())
    if LOG:
        # One write of one line: several processes append to their own file.
        with open(os.path.join(LOG, f"worker-{WORKER}.jsonl"), "a") as f:
            f.write(json.dumps(event) + "\n")


def data():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm], y[perm]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


class StepCallback(keras.callbacks.Callback):
    """Counts global steps and samples, logs each generation's first step
    and SIGKILLs this worker at ELASTIC_KILL's step."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.kill_worker, _, kill_step = KILL.partition(":")
        self.kill_step = int(kill_step or -1)
        self.first = True

    def on_train_batch_begin(self, batch, logs=None):
        if self.kill_worker == WORKER and self.state.step == self.kill_step:
            log(event="kill", step=self.state.step)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        self.state.step += 1
        self.state.processed += BATCH * hvd.size()
        if self.first:
            log(event="step", step=self.state.step, size=hvd.size(), rank=hvd.rank())
            self.first = False
        if SLEEP:
            time.sleep(SLEEP)

    def on_epoch_end(self, epoch, logs=None):
        self.state.processed = 0


def main():
    hvd.init()
    (xtr, ytr), (xte, yte) = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.05, momentum=0.9))
    model.compile(optimizer=opt, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = elastic.KerasState(model, epoch=0, batch=0, step=0, processed=0, grown=False,
                               end_epoch=EPOCHS, resets=0)

    def on_reset():
        # sync() broadcasts rank 0's *saved* state: save the count, or every
        # rank would go back to the last commit's.
        state.resets += 1
        state.save()
        log(event="reset", size=hvd.size(), rank=hvd.rank())

    state.register_reset_callbacks([on_reset])

    @elastic.run
    def train(state):
        step_cb = StepCallback(state)
        callbacks = [step_cb, elastic.UpdateEpochStateCallback(state),
                     elastic.UpdateBatchStateCallback(state),
                     elastic.CommitStateCallback(state, batches_per_commit=4)]
        # hvd.size() and the synced reset count are the same on every rank: all
        # agree; the grown group trains at least one epoch
        if not state.grown and hvd.size() >= WAIT_SIZE and state.resets >= WAIT_RESETS:
            state.grown, state.end_epoch = True, max(EPOCHS, state.epoch + 1)
        while state.epoch < state.end_epoch or (not state.grown and state.epoch < 200):
            # What is left of this epoch, split over the current ranks in
            # whole global batches (every rank takes the same number of steps).
            order = np.random.default_rng(1 + state.epoch).permutation(len(xtr))[state.processed:]
            size, rank = hvd.size(), hvd.rank()
            steps = len(order) // (BATCH * size)
            if steps == 0:  # nothing left but a partial global batch
                state.epoch, state.batch, state.processed = state.epoch + 1, 0, 0
                state.commit()
                continue
            mine = order[:steps * BATCH * size].reshape(steps, size, BATCH)[:, rank].reshape(-1)
            model.fit(xtr[mine], ytr[mine], batch_size=BATCH, epochs=1, shuffle=False,
                      verbose=0, callbacks=callbacks)

    train(state)
    acc = float(np.mean(np.argmax(model.predict(xte, verbose=0), axis=1) == yte))
    h = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
    log(event="result", rank=hvd.rank(), size=hvd.size(), acc=acc, hash=h.hexdigest(),
        backend=keras.backend.backend(),
        steps=state.step)
    sys.stdout.write(f"RESULT worker={WORKER} rank={hvd.rank()} size={hvd.size()} "
                     f"acc={acc:.4f}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
