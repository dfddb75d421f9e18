# tests/parallel/hvd_compat_reference.py — single-process reference for the
# Horovod compatibility scripts: the same model (rank 0's seed), the same
# steps on the combined batches of all N ranks, no gradflow and no horovod.
# Usage: hvd_compat_reference.py torch|keras N OUT.npz [CHECKPOINT] ->
# params (flat float32, in model.parameters() / get_weights() order),
# per-epoch losses averaged as the scripts' metric average computes them,
# and the script's rank-0 checkpoint read back into the same flat order.
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402

from hvd_compat_data import (BASE_LR, BATCH, EPOCHS, SAMPLES, keras_model,  # noqa: E402
                             regression_data, torch_model)


def torch_reference(n):
    """DistributedSampler(shuffle=False) gives rank r samples r, r+n, ...; step
    s of every rank together covers the block [s*B*n, (s+1)*B*n). Averaging
    the ranks' mean-loss gradients = the gradient of the block's mean loss."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    x, y = (torch.from_numpy(a) for a in regression_data())
    model = torch_model(seed=1234)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * n, momentum=0.9)
    steps = SAMPLES // (BATCH * n)
    losses = []
    for _ in range(EPOCHS):
        per_rank = np.zeros(n)
        for s in range(steps):
            xb, yb = x[s * BATCH * n:(s + 1) * BATCH * n], y[s * BATCH * n:(s + 1) * BATCH * n]
            with torch.no_grad():  # each rank's own loss item (rows r, r+n, ... of the block)
                pred = model(xb)
                for r in range(n):
                    per_rank[r] += F.mse_loss(pred[r::n], yb[r::n]).item()
            opt.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            opt.step()
        losses.append(float(np.mean(per_rank / steps)))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    return flat, np.array(losses)


def keras_reference(n):
    """x[r::n] batched by B: step s of all ranks covers rows of the block
    [s*B*n, (s+1)*B*n) again, so one batch of B*n rows per step."""
    import keras
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    x, y = regression_data()
    model = keras_model(seed=100)
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(learning_rate=BASE_LR * n))
    hist = model.fit(x, y, batch_size=BATCH * n, epochs=EPOCHS, shuffle=False, verbose=0)
    flat = np.concatenate([np.asarray(w, np.float32).reshape(-1) for w in model.get_weights()])
    return flat, np.array(hist.history["loss"])


def read_checkpoint(kind, path):
    """The flat parameters a script's checkpoint holds."""
    if kind == "torch":
        import torch
        state = torch.load(path)
        return torch.cat([v.reshape(-1) for v in state.values()]).numpy()
    model = keras_model(seed=0)
    model.load_weights(path)
    return np.concatenate([np.asarray(w, np.float32).reshape(-1) for w in model.get_weights()])


if __name__ == "__main__":
    kind, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    params, losses = (torch_reference if kind == "torch" else keras_reference)(n)
    extra = {"checkpoint": read_checkpoint(kind, sys.argv[4])} if len(sys.argv) > 4 else {}
    np.savez(out, params=params, losses=losses, **extra)
