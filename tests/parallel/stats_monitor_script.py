"""TensorBoard monitoring under mpiexec (tests/parallel/test_monitoring.py):
gradflow.torch.StatsLogger (argv torch) or gradflow.keras.callbacks.
TensorBoardStatsCallback (argv keras) during a few training steps with the
fp16 wire, one step with an extra allreduce that overflows the 16-bit wire
and one step where rank 1 arrives late (GRADFLOW_STALL_CHECK_TIME is set
short by the caller, so rank 0 raises a stall warning). Then the event files
are read back: written by rank 0 only, and every byte/count scalar equals
the difference of gradflow.stats() snapshots this script took itself after
each step. argv: torch|keras LOG_DIR. Prints "ok <check> (size N)".
"""
import glob
import os
import sys
import time

import numpy as np

import gradflow

framework, log_dir = sys.argv[1], sys.argv[2]
STEPS, EVERY, OVERFLOW_STEP, LATE_STEP = 6, 2, 3, 5


def ok(what: str) -> None:
    sys.stdout.write(f"ok {what} (size {N})\n")  # one write: ranks' lines never interleave
    sys.stdout.flush()


def between_steps(step: int, allreduce) -> None:
    """Run by every rank after step `step` (1-based) has finished."""
    if step == OVERFLOW_STEP:  # counted with this step (snapshot taken after)
        allreduce(np.full(16, 1e5, np.float32))  # > 65504: inf on the fp16 wire
    if step == LATE_STEP - 1 and R == 1:  # so step LATE_STEP starts late on rank 1
        time.sleep(4.0)  # rank 0 waits for rank 1's gradients > GRADFLOW_STALL_CHECK_TIME


if framework == "torch":
    import torch
    import gradflow.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    R, N = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    g = torch.Generator().manual_seed(R)
    logger = hvd.StatsLogger(log_dir=log_dir, every=EVERY)
    snaps, written = [hvd.stats()], []

    def fp16_allreduce(a):
        hvd.allreduce(torch.from_numpy(a), op=hvd.Sum, compression=hvd.Compression.fp16)

    for step in range(1, STEPS + 1):
        x, t = torch.randn(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), t).backward()
        opt.step()
        between_steps(step, fp16_allreduce)
        snaps.append(gradflow.stats())
        written.append(logger.step())
    logger.close()
else:
    import keras
    import gradflow.keras as hvd
    from gradflow.keras.callbacks import BroadcastGlobalVariablesCallback, TensorBoardStatsCallback

    hvd.init()
    R, N = hvd.rank(), hvd.size()
    snaps, written = [], []

    class Snapshot(keras.callbacks.Callback):
        """Listed before the stats callback: its snapshot after a batch is
        what the stats callback reads next (no collective runs in between)."""

        def on_train_begin(self, logs=None):
            snaps.append(gradflow.stats())

        def on_train_batch_end(self, batch, logs=None):
            between_steps(batch + 1, lambda a: gradflow.allreduce(
                a, op=gradflow.Sum, compression=hvd.Compression.fp16))
            snaps.append(gradflow.stats())

    class Written(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            written.append(dict(stats_cb.last) if (batch + 1) % EVERY == 0 and R == 0 else {})

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                     compression=hvd.Compression.fp16),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(R)
    x, t = rng.normal(size=(8 * STEPS, 64)).astype(np.float32), rng.integers(0, 10, 8 * STEPS)
    stats_cb = TensorBoardStatsCallback(log_dir, update_freq=EVERY)
    model.fit(x, t, batch_size=8, epochs=1, verbose=0, shuffle=False,
              callbacks=[BroadcastGlobalVariablesCallback(0), Snapshot(), stats_cb,
                         Written()])

# ------------------------------------------------------------------ checks
assert len(snaps) == STEPS + 1 and len(written) == STEPS, (len(snaps), len(written))
pids = gradflow.allgather(np.array([os.getpid()], np.int64)).tolist()
gradflow.barrier()  # every writer closed/flushed before rank 0 reads
files = sorted(glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True))
assert len(files) == 1 and f".{pids[0]}." in os.path.basename(files[0]), (files, pids)
if R != 0:
    assert all(w == {} for w in written), written
ok("event file written by rank 0 only")

if R == 0:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(files[0], size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()
    if framework == "torch":
        events = {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in tags["scalars"]}
    else:  # tf.summary writes scalars as tensors
        from tensorboard.util import tensor_util
        events = {t: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                      for e in ea.Tensors(t)] for t in tags["tensors"]}
    steps = list(range(EVERY, STEPS + 1, EVERY))
    for tag in ("bytes_sent_per_step", "bytes_received_per_step", "allreduce_input_bytes_per_step",
                "allreduces_per_step", "wire_overflow", "effective_compression", "step_seconds",
                "comm_seconds_per_step", "comm_fraction", "stall_warnings"):
        got = events.get("gradflow/" + tag)
        assert got is not None and [s for s, _ in got] == steps, (tag, got)

    def delta(key, k):
        return snaps[k].get(key, 0.0) - snaps[k - EVERY].get(key, 0.0)

    for i, k in enumerate(steps):
        value = {t[len("gradflow/"):]: v[i][1] for t, v in events.items()}
        want = {"bytes_sent_per_step": delta("bytes_sent", k) / EVERY,
                "bytes_received_per_step": delta("bytes_received", k) / EVERY,
                "allreduce_input_bytes_per_step": delta("allreduce.bytes_input", k) / EVERY,
                "allreduces_per_step": delta("allreduce.count", k) / EVERY,
                "wire_overflow": delta("wire_overflow", k),
                "effective_compression": delta("allreduce.bytes_input", k) / delta("bytes_sent", k),
                "stall_warnings": snaps[k].get("stall_warnings", 0.0)}
        for name, w in want.items():
            assert np.isclose(value[name], w, rtol=1e-6, atol=0), (k, name, value[name], w)
            assert np.isclose(written[k - 1]["gradflow/" + name], w, rtol=1e-12), (k, name)
        assert value["bytes_sent_per_step"] > 0 and value["step_seconds"] > 0, value
        assert 0 <= value["comm_fraction"] and value["comm_seconds_per_step"] >= 0, value
        # the fp16 wire halves the bytes: more than one input byte per byte sent on 2 ranks
        assert N != 2 or value["effective_compression"] > 1.5, value
    overflow_interval = (OVERFLOW_STEP - 1) // EVERY
    assert [v for _, v in events["gradflow/wire_overflow"]][overflow_interval] >= 1, events
    stalls = [v for _, v in events["gradflow/stall_warnings"]]
    late_interval = (LATE_STEP - 1) // EVERY
    assert stalls[late_interval] > stalls[late_interval - 1], stalls  # the late rank was seen
ok("scalars equal the gradflow.stats() deltas (bytes, counts, overflow, stalls)")
