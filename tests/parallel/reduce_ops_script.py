# reduce_ops_script.py — reduce ops with Horovod's integer values on every API.
# Raw ints 0..5 (Average, Sum, Adasum, Min, Max, Product) through the numpy,
# torch and TensorFlow allreduce (+ grouped / reducescatter), Horovod's
# deprecated average=, and errors (unknown ints, average+op; Adasum where it
# cannot run: reducescatter, a rank count that is not a power of two) that
# must raise on every rank and leave the runtime working. Adasum's own
# numbers are tests/parallel/adasum_script.py's job; here raw int 2 reaches
# it on every API. Args: "torch", "tf".
import sys

import numpy as np

import gradflow as gf
from _adasum_model import adasum

gf.init()
R, N = gf.rank(), gf.size()
HVD = {"Average": 0, "Sum": 1, "Adasum": 2, "Min": 3, "Max": 4, "Product": 5}
REF = {0: lambda s: s.mean(0), 1: lambda s: s.sum(0), 3: lambda s: s.min(0),
       4: lambda s: s.max(0), 5: lambda s: s.prod(0)}


def x_of(r):
    return np.array([1.5, -2.0, 3.0, 0.5], np.float64) * (r + 1) + r


STACK = np.stack([x_of(r) for r in range(N)])
POW2 = N & (N - 1) == 0
ADASUM = adasum([[x_of(r)] for r in range(N)], np.float64)[0] if POW2 else None


def close(got, want, what):
    got = np.asarray(got, np.float64)
    if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
        raise AssertionError(f"rank {R}: {what}: got {got}, want {want}")


def raises(fn, exc, text, what):
    try:
        fn()
    except exc as e:
        if text not in str(e):
            raise AssertionError(f"rank {R}: {what}: message {e!r} lacks {text!r}")
        return
    raise AssertionError(f"rank {R}: {what}: no {exc.__name__}")


def bad_ops(allreduce, what, adasum_runs=True):
    """Unknown ints raise on every rank, and Adasum (raw 2 or gf.Adasum) where
    it cannot run (`adasum_runs` False: not an allreduce; or N not a power
    of two); elsewhere Adasum gives the model's value. The runtime keeps
    working."""
    for op in (2, gf.Adasum):
        if not adasum_runs:
            raises(lambda: allreduce(op), ValueError, "only allreduce supports op=Adasum",
                   f"{what} Adasum")
        elif not POW2:
            raises(lambda: allreduce(op), ValueError, "power-of-two number of ranks",
                   f"{what} Adasum")
        else:
            close(allreduce(op), ADASUM, f"{what} Adasum op={op!r}")
    for bad in (6, -1, 17):
        raises(lambda: allreduce(bad), ValueError, "unknown reduce op", f"{what} op={bad}")
    close(allreduce(1), STACK.sum(0), f"{what} Sum after errors")


# names and values are Horovod's
for nm, v in HVD.items():
    assert int(getattr(gf, nm)) == v and gf.ReduceOp[nm] == v, nm

# ---- numpy API
for op, ref in REF.items():
    close(gf.allreduce(x_of(R), op=op), ref(STACK), f"numpy allreduce op={op}")
    close(gf.allreduce(x_of(R), op=gf.ReduceOp(op)), ref(STACK), f"numpy allreduce ReduceOp({op})")
    rows = np.tile(x_of(R), (N, 1))
    close(gf.reducescatter(rows, op=op)[0], ref(STACK), f"numpy reducescatter op={op}")
close(gf.allreduce(x_of(R)), STACK.mean(0), "numpy default is Average")
bad_ops(lambda op: gf.allreduce(x_of(R), op=op), "numpy allreduce")
bad_ops(lambda op: gf.reducescatter(np.tile(x_of(R), (N, 1)), op=op)[0], "numpy reducescatter",
        adasum_runs=False)
print(f"ok numpy (size {N})", flush=True)

if "torch" in sys.argv:
    import torch

    import gradflow.torch as ht

    t = torch.tensor(x_of(R))
    for op, ref in REF.items():
        close(ht.allreduce(t, op=op), ref(STACK), f"torch allreduce op={op}")
        close(ht.allreduce_(t.clone(), op=op), ref(STACK), f"torch allreduce_ op={op}")
        close(ht.synchronize(ht.allreduce_async(t, op=op)), ref(STACK), f"torch async op={op}")
        close(ht.synchronize(ht.allreduce_async_(t.clone(), op=op)), ref(STACK), f"torch async_ {op}")
        close(ht.grouped_allreduce([t, t], op=op)[1], ref(STACK), f"torch grouped op={op}")
        rows = torch.tensor(np.tile(x_of(R), (N, 1)))
        close(ht.reducescatter(rows, op=op)[0], ref(STACK), f"torch reducescatter op={op}")
    # Horovod's positional order: allreduce(tensor, average, name, ...)
    close(ht.allreduce(t, True), STACK.mean(0), "torch average=True")
    close(ht.allreduce(t, False), STACK.sum(0), "torch average=False")
    close(ht.allreduce(t, average=False, name="avg.false"), STACK.sum(0), "torch average=False kw")
    close(ht.allreduce_(t.clone(), False), STACK.sum(0), "torch allreduce_ average=False")
    close(ht.synchronize(ht.allreduce_async(t, False)), STACK.sum(0), "torch async average=False")
    close(ht.synchronize(ht.allreduce_async_(t.clone(), True)), STACK.mean(0), "torch async_ True")
    for fn in (ht.allreduce, ht.allreduce_, ht.allreduce_async, ht.allreduce_async_):
        raises(lambda: fn(t.clone(), average=True, op=ht.Sum), ValueError, "supersedes average",
               f"torch {fn.__name__} average+op")
    raises(lambda: ht.allreduce(t, ht.Sum), TypeError, "average= must be a bool",
           "torch ReduceOp passed as average")
    bad_ops(lambda op: ht.allreduce(t, op=op), "torch allreduce")
    bad_ops(lambda op: ht.synchronize(ht.allreduce_async_(t.clone(), op=op)), "torch async_")
    bad_ops(lambda op: ht.grouped_allreduce([t], op=op)[0], "torch grouped")
    model = torch.nn.Linear(2, 1)
    raises(lambda: ht.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters(), op=9),
           ValueError, "unknown reduce op", "torch optimizer op=9")
    # op=Sum (raw 1) in the optimizer sums the gradients (pool path)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    opt = ht.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                  named_parameters=model.named_parameters(), op=1)
    w0 = model.weight.detach().clone()
    model(t.float().reshape(1, 4)).sum().backward()
    opt.step()
    close((w0 - model.weight.detach()).reshape(-1).double(), STACK.sum(0).astype(np.float32),
          "torch optimizer op=1 sums gradients")
    print(f"ok torch (size {N})", flush=True)

if "tf" in sys.argv:
    import tensorflow as tf

    import gradflow.tensorflow as gtf

    x = tf.constant(x_of(R))
    for op, ref in REF.items():
        close(gtf.allreduce(x, op=op), ref(STACK), f"tf allreduce op={op}")
        close(gtf.grouped_allreduce([x, x], op=op)[0], ref(STACK), f"tf grouped op={op}")
        rows = tf.constant(np.tile(x_of(R), (N, 1)))
        close(gtf.reducescatter(rows, op=op)[0], ref(STACK), f"tf reducescatter op={op}")
        fn = tf.function(lambda v, op=op: gtf.allreduce(v, op=op, name=f"tf.fn.{op}"))
        close(fn(x), ref(STACK), f"tf.function allreduce op={op}")
    # Horovod's positional order: allreduce(tensor, average, device_dense, device_sparse, ...)
    close(gtf.allreduce(x, False), STACK.sum(0), "tf average=False")
    close(gtf.allreduce(x, True, "", ""), STACK.mean(0), "tf average=True")
    close(gtf.allreduce(x, average=False, device_dense="/cpu:0"), STACK.sum(0), "tf device_dense")
    close(gtf.grouped_allreduce([x], False)[0], STACK.sum(0), "tf grouped average=False")
    raises(lambda: gtf.allreduce(x, average=True, op=gtf.Sum), ValueError, "supersedes average",
           "tf average+op")
    raises(lambda: gtf.grouped_allreduce([x], average=False, op=gtf.Sum), ValueError,
           "supersedes average", "tf grouped average+op")
    raises(lambda: gtf.allreduce(x, gtf.Sum), TypeError, "average= must be a bool",
           "tf ReduceOp passed as average")
    bad_ops(lambda op: gtf.allreduce(x, op=op), "tf allreduce")
    bad_ops(lambda op: gtf.grouped_allreduce([x], op=op)[0], "tf grouped")
    bad_ops(lambda op: gtf.reducescatter(tf.constant(np.tile(x_of(R), (N, 1))), op=op)[0],
            "tf reducescatter", adasum_runs=False)
    # DistributedGradientTape op=1 is Sum (Horovod's meaning of the raw int)
    w = tf.Variable(tf.zeros([4], tf.float64))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * x)
    g = gtf.DistributedGradientTape(tape, op=1).gradient(loss, [w])[0]
    close(g, STACK.sum(0), "tf DistributedGradientTape op=1")
    # op=2 is Adasum in the tape too (power-of-two sizes; a clear error otherwise)
    def tape_grad(op):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * x)
        return gtf.DistributedGradientTape(tape, op=op).gradient(loss, [w])[0]
    bad_ops(tape_grad, "tf DistributedGradientTape")
    # The tape and the Keras optimizer refuse unknown ints when made, not at
    # the first gradient; Adasum is accepted.
    import keras
    import gradflow.keras as gk
    with tf.GradientTape() as tape:
        pass
    raises(lambda: gtf.DistributedGradientTape(tape, op=9), ValueError, "unknown reduce op",
           "tf tape op=9")
    raises(lambda: gk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=9), ValueError,
           "unknown reduce op", "keras optimizer op=9")

    def keras_step(op):  # SGD(lr=1) from zero: the variable ends at -reduced gradient
        opt = gk.DistributedOptimizer(keras.optimizers.SGD(1.0), op=op)
        v = keras.Variable(np.zeros(4), dtype="float64")
        opt.apply([x], [v])
        return -v.numpy()
    bad_ops(keras_step, "keras optimizer")
    print(f"ok tf (size {N})", flush=True)

gf.barrier()
print(f"ok done (size {N})", flush=True)
