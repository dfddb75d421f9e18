# examples/keras_digits.py — Keras 3 model.fit on sklearn digits with gradflow:
# DistributedOptimizer plus the callbacks. Run:
#   gradflowrun -np 2 python examples/keras_digits.py
# Each rank trains on its shard; rank 0 prints progress and the test accuracy.
"""Data-parallel Keras training on sklearn digits (expects >= 95% test accuracy)."""
import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import numpy as np  # noqa: E402
import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import gradflow.keras as gk  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by the number of ranks")
    p.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "keras_digits_best.keras"))
    args = p.parse_args()

    gk.init()
    keras.utils.set_random_seed(42 + gk.rank())  # different on purpose: the broadcast aligns them
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    # Each rank trains on its own shard; validation likewise (metrics are averaged).
    shard = slice(gk.rank(), None, gk.size())
    X_val, y_val = X_test[shard], y_test[shard]

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(10),
    ])
    lr = args.lr * gk.size()
    opt = gk.DistributedOptimizer(keras.optimizers.SGD(learning_rate=lr, momentum=0.9))
    model.compile(optimizer=opt, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        gk.BroadcastGlobalVariablesCallback(0),       # first: same start everywhere
        gk.MetricAverageCallback(),                   # before anything that reads metrics
        gk.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=3, verbose=1),
        # 10x lower from epoch 20 on (a float multiplier would decay it
        # every epoch: multiplier ** (epoch - start_epoch), as in Horovod 0.28)
        gk.LearningRateScheduleCallback(initial_lr=lr, multiplier=lambda epoch: 0.1,
                                        start_epoch=20),
        gk.BestModelCheckpoint(args.checkpoint, monitor="val_accuracy"),
    ]
    model.fit(X_train[shard], y_train[shard], batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(X_val, y_val), callbacks=callbacks,
              verbose=1 if gk.rank() == 0 else 0)
    _, acc = model.evaluate(X_test, y_test, verbose=0)
    if gk.rank() == 0:
        print(f"test accuracy {acc:.4f} on {gk.size()} ranks (best model saved to {args.checkpoint})")


if __name__ == "__main__":
    main()
