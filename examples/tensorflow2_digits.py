# examples/tensorflow2_digits.py — a custom TF2 training loop with gradflow:
# DistributedGradientTape inside tf.function, broadcast_variables after the
# first step. Run:  gradflowrun -np 2 python examples/tensorflow2_digits.py
"""Custom-loop data-parallel training on sklearn digits with DistributedGradientTape."""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import gradflow.tensorflow as gtf  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the number of ranks")
    args = p.parse_args()

    gtf.init()
    tf.random.set_seed(7 + gtf.rank())  # different on purpose: broadcast_variables aligns them
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y.astype(np.int64), test_size=0.2,
                                                        random_state=0, stratify=y)
    shard = slice(gtf.rank(), None, gtf.size())
    data = (tf.data.Dataset.from_tensor_slices((X_train[shard], y_train[shard]))
            .shuffle(1000, seed=gtf.rank()).batch(args.batch_size))

    w1 = tf.Variable(tf.random.normal([64, 128], stddev=0.1))
    b1 = tf.Variable(tf.zeros([128]))
    w2 = tf.Variable(tf.random.normal([128, 10], stddev=0.1))
    b2 = tf.Variable(tf.zeros([10]))
    variables = [w1, b1, w2, b2]
    opt = tf.keras.optimizers.SGD(learning_rate=args.lr * gtf.size(), momentum=0.9)

    def logits(x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2

    @tf.function
    def train_step(x, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits(x)))
        tape = gtf.DistributedGradientTape(tape)  # averaged over ranks, one host crossing
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return loss

    gtf.broadcast_variables(variables, root_rank=0)  # same start everywhere
    for epoch in range(args.epochs):
        losses = [train_step(x, t).numpy() for x, t in data]
        # Average the epoch loss across ranks for the report.
        mean_loss = gtf.allreduce(tf.constant(np.mean(losses)), name="epoch_loss").numpy()
        if gtf.rank() == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(f"epoch {epoch + 1}: loss {mean_loss:.4f}", flush=True)
    acc = np.mean(np.argmax(logits(tf.constant(X_test)).numpy(), 1) == y_test)
    if gtf.rank() == 0:
        print(f"test accuracy {acc:.4f} on {gtf.size()} ranks")


if __name__ == "__main__":
    main()
