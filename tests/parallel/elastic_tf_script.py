"""Elastic TensorFlow 2 training (no Keras fit): the digits MLP trained with
DistributedGradientTape inside a tf.function, its variables kept by
gradflow.tensorflow.elastic.TensorFlowState, under `gradflowrun --min-np ...`
(tests/parallel/test_elastic_tf.py). Knobs and JSON log as
elastic_torch_script.py: ELASTIC_EPOCHS, ELASTIC_KILL ("WORKER:STEP"),
ELASTIC_LOG. Batches come from a per-epoch permutation (seed + epoch, the
same on every worker); `state.batch_samples` samples of the epoch are done,
so a re-formed group goes on with the next ones, split over its ranks."""
import hashlib
import json
import os
import signal
import sys
import time

from _tf_common import tf  # noqa: E402  (before TensorFlow loads: quiet, one thread)
import numpy as np  # noqa: E402

import gradflow.tensorflow as hvd  # noqa: E402
import gradflow.tensorflow.elastic as elastic  # noqa: E402

WORKER = os.environ.get("GRADFLOW_ELASTIC_WORKER", "?")
LOG = os.environ.get("ELASTIC_LOG")
EPOCHS = int(os.environ.get("ELASTIC_EPOCHS", "3"))
KILL = os.environ.get("ELASTIC_KILL", "")
BATCH = 32  # per rank


def log(**event):
    event.update(worker=WORKER, t=time.time())
    if LOG:
        with open(os.path.join(LOG, f"worker-{WORKER}.jsonl"), "a") as f:
            f.write(json.dumps(event) + "\n")


def main():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(x))
    (xtr, ytr), (xte, yte) = (x[perm[:1400]], y[perm[:1400]]), (x[perm[1400:]], y[perm[1400:]])
    hvd.init()
    rng = np.random.default_rng(0)
    w1 = tf.Variable(rng.normal(0, 0.1, (64, 64)).astype(np.float32))
    b1 = tf.Variable(np.zeros(64, np.float32))
    w2 = tf.Variable(rng.normal(0, 0.1, (64, 10)).astype(np.float32))
    b2 = tf.Variable(np.zeros(10, np.float32))
    params = [w1, b1, w2, b2]
    velocity = [tf.Variable(tf.zeros_like(p)) for p in params]  # momentum, kept in the state

    def logits(xb):
        return tf.matmul(tf.nn.relu(tf.matmul(xb, w1) + b1), w2) + b2

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits(xb)))
        grads = hvd.DistributedGradientTape(tape).gradient(loss, params)
        for p, v, g in zip(params, velocity, grads):
            v.assign(0.9 * v + g)
            p.assign_sub(0.05 * v)

    state = elastic.TensorFlowState(params + velocity, epoch=0, batch_samples=0, step=0)
    state.register_reset_callbacks([lambda: log(event="reset", size=hvd.size(), rank=hvd.rank())])
    kill_worker, _, kill_step = KILL.partition(":")

    @elastic.run
    def train(state):
        first = True
        while state.epoch < EPOCHS:
            size, rank = hvd.size(), hvd.rank()
            order = np.random.default_rng(1 + state.epoch).permutation(len(xtr))
            done = state.batch_samples
            rest = order[done:]
            for b in range(len(rest) // (BATCH * size)):
                if kill_worker == WORKER and state.step == int(kill_step or -1):
                    log(event="kill", step=state.step)
                    os.kill(os.getpid(), signal.SIGKILL)
                idx = rest[(b * size + rank) * BATCH:(b * size + rank + 1) * BATCH]
                step(xtr[idx], ytr[idx])
                state.step += 1
                state.batch_samples = done + (b + 1) * BATCH * size
                if first:
                    log(event="step", step=state.step, size=size, rank=rank)
                    first = False
                if state.step % 4 == 0:
                    state.commit()
            state.epoch, state.batch_samples = state.epoch + 1, 0
            state.commit()

    train(state)
    acc = float(np.mean(np.argmax(logits(xte).numpy(), axis=1) == yte))
    h = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params))
    log(event="result", rank=hvd.rank(), size=hvd.size(), acc=acc, hash=h.hexdigest(),
        steps=state.step)
    sys.stdout.write(f"RESULT worker={WORKER} rank={hvd.rank()} size={hvd.size()} acc={acc:.4f}\n")


if __name__ == "__main__":
    main()
