# tests/parallel/hvd_keras_compat_script.py — an unmodified Horovod Keras
# training script (horovod.tensorflow.keras with its callbacks; it imports
# horovod, never gradflow), run by test_horovod_compat_mode.py under
# `gradflowrun --horovod-compat`. Usage: script.py OUT_DIR.
# Each rank seeds its model differently, so BroadcastGlobalVariablesCallback
# must work for the ranks to agree; rank 0 checkpoints.
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402

from hvd_compat_data import BASE_LR, BATCH, EPOCHS, keras_model, regression_data  # noqa: E402

out_dir = sys.argv[1]
hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)

x, y = regression_data()
x_shard, y_shard = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]

model = keras_model(seed=100 + hvd.rank())
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=BASE_LR * hvd.size()))
model.compile(loss="mse", optimizer=opt)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(
        os.path.join(out_dir, "checkpoint.weights.h5"), save_weights_only=True))
history = model.fit(x_shard, y_shard, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                    callbacks=callbacks, verbose=0)
if hvd.rank() == 0:
    for epoch, loss in enumerate(history.history["loss"]):
        print(f"epoch {epoch} avg_loss {float(loss)!r}", flush=True)

flat = np.concatenate([np.asarray(w, np.float32).reshape(-1) for w in model.get_weights()])
print(f"rank {hvd.rank()} of {hvd.size()} params {hashlib.sha256(flat.tobytes()).hexdigest()} "
      f"module {hvd.__name__}", flush=True)
