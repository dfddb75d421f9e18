# tests/parallel/step_tag_script.py — SPMD script (test_errors.py): the core's
# step tags (native Note [Step tags]) through the numpy API. Step 1: every
# rank submits three allreduces under one tag and gets numpy's sums (the
# responses are cached). Step 2: the last rank submits them under another
# tag (as a rank whose traced step lost a gradient would), with the default
# GRADFLOW_TIMEOUT: every rank's waits fail within seconds, the message names
# both tags and both ranks, and the runtime is then dead (the job failed). Each
# rank prints one line and exits non-zero through gradflow's fatal exit.
import sys
import time

import numpy as np

import gradflow

gradflow.init()
R, N = gradflow.rank(), gradflow.size()
values = [np.arange(5, dtype=np.float32) * (R + 1) + k for k in range(3)]
handles = [gradflow.collectives.allreduce_async(v, gradflow.Sum, f"grad.{k}", step_tag="3 of 3 #a")
           for k, v in enumerate(values)]
for k, h in enumerate(handles):
    ref = sum(np.arange(5, dtype=np.float32) * (r + 1) + k for r in range(N))
    assert np.array_equal(h.wait(), ref), k

# argv[1] (default "gradients"): which tags step 2 differs in. "hyper" and
# "both": tags of two checks joined by " & " (a traced Keras step's gradient
# list & its hyperparameters); the first part that differs names the cause.
VARIANT = sys.argv[1] if len(sys.argv) > 1 else "gradients"
good, bad = {"gradients": ("3 of 3 #a", "2 of 3 #b"),
             "hyper": ("3 of 3 #a & hyperparameters #1 now lr=0.1",
                       "3 of 3 #a & hyperparameters #2 now lr=0.2"),
             "both": ("3 of 3 #a & hyperparameters #1 now lr=0.1",
                      "2 of 3 #b & hyperparameters #2 now lr=0.2")}[VARIANT]
tag = bad if R == N - 1 else good
t0 = time.monotonic()
handles = [gradflow.collectives.allreduce_async(v, gradflow.Sum, f"grad.{k}", step_tag=tag)
           for k, v in enumerate(values)]
errors = []
for h in handles:
    try:
        h.wait()
    except gradflow.GradflowError as e:
        errors.append(str(e))
took = time.monotonic() - t0
assert len(errors) == 3, errors
why = ("the ranks' optimizer hyperparameters differ" if VARIANT == "hyper"
       else "the ranks reduce different sets of gradients in one step")
want = (f"{why}: rank 0 submitted allreduce 'grad.0' as part of {{{good}}} but rank {N - 1} "
        f"as part of {{{bad}}}")
assert want in errors[0], errors[0]
assert took < 20, f"the error came after {took:.1f} s"
try:
    gradflow.allreduce(np.ones(2, np.float32), name="after")
except gradflow.GradflowError as e:
    assert why in str(e), str(e)
else:
    raise AssertionError("the runtime went on after the ranks' steps differed")
print(f"step tags OK rank {R} of {N}", flush=True)
