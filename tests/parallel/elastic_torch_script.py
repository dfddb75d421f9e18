"""Elastic training of the digits MLP under `gradflowrun --min-np ...`
(tests/parallel/test_elastic.py). Everything a test needs comes from the
environment:

  ELASTIC_EPOCHS       epochs to train (default 6)
  ELASTIC_KILL         "WORKER:STEP[,WORKER:STEP...]": the worker with that
                       gradflowrun worker id SIGKILLs itself once STEP global steps
                       are done, before the next one (worker ids are not reused)
  ELASTIC_LOG          a directory: each worker appends one JSON object per line
                       (events: kill, step, reset, result) to worker-<id>.jsonl
  ELASTIC_STEP_SLEEP   seconds to sleep per step (to give a test time to act)
  ELASTIC_WAIT         "SIZE:RESETS": keep training past ELASTIC_EPOCHS (up to 200
                       epochs) until, after at least RESETS resets, the group has
                       had SIZE workers (a joiner may take a while to start on a
                       loaded machine)
  ELASTIC_OPTIMIZER    DistributedOptimizer options: "csc" (sparse_ratio=0.1,
                       fp16 wire), "bpps2" (backward_passes_per_step=2)
  ELASTIC_EXIT_AFTER   "WORKER:CODE": that worker waits 2 s after training (so
                       another has finished) and exits with CODE, as a crash in
                       a checkpoint save would
  ELASTIC_DIE_AFTER_FINISH  "WORKER[:train]": after training (after train(),
                       or at the end of it: inside the elastic run loop),
                       every rank logs its parameters' hash ("trained") and
                       registers a process set of ranks 1..size-1; rank 0 then
                       ends (the driver counts training as finished) while the
                       others allreduce on the set; once rank 0's process is
                       gone (+ 2 s for the driver to see it) worker WORKER
                       SIGKILLs itself instead. The others log "set_wait" and
                       the error they get ("set_error", or "set_done")
  ELASTIC_GATE         a path the test creates at a moment of its choosing (it
                       saw a newcomer ready in gradflowrun's output), for:
  ELASTIC_KILL_AT_GATE "WORKER": that worker SIGKILLs itself at its first step
                       once the gate exists
  ELASTIC_EXIT_AT_GATE "WORKER": that worker, dismissed (its host removed),
                       leaves only once the gate exists (at most 120 s): the
                       others re-form only after it left, so the newcomer is
                       ready by then and joins the same generation
  ELASTIC_AMP          "auto": a torch.amp GradScaler (CPU, growing every 2 steps)
                       given to DistributedOptimizer(grad_scaler=) only (it joins
                       the state by itself); "state": also TorchState(scaler=),
                       and the loop uses state.scaler. Its final scale is logged
  ELASTIC_SCHEDULER    if set, a StepLR (step_size 3, gamma 0.9) stepped after
                       every optimizer step, given to TorchState(scheduler=);
                       the final learning rate and scheduler epoch are logged
  ELASTIC_SAMPLES      if set, log a "batch" event per step: epoch, step, the
                       reset count and the dataset indices this rank trained on
                       (the test checks ElasticSampler's coverage with them)
  ELASTIC_DIE_IN_WINDOW  "WORKER:STEP" (with GRADFLOW_ALLREDUCE_ALGO=two-sync
                       and GRADFLOW_TEST_WINDOW_FAULT_LIB): before step STEP
                       every rank allreduces a 1 MiB tensor (the two-sync
                       windows grow: a new window is created) and worker
                       WORKER's loop thread dies inside that creation
                       (die_in_window_creation.c), the others waiting in
                       MPI_Win_allocate_shared; the logged "big" sum is checked

Each rank's final parameters are hashed; the test checks that every rank of
the last generation ends with the same hash and that the accuracy is close
to the fault-free run's.
"""
import hashlib
import json
import os
import signal
import sys
import time

# Before gradflow loads MPI (RTLD_GLOBAL: the extension binds to it).
FAULT = None
if os.environ.get("GRADFLOW_TEST_WINDOW_FAULT_LIB"):
    import ctypes
    FAULT = ctypes.CDLL(os.environ["GRADFLOW_TEST_WINDOW_FAULT_LIB"], mode=ctypes.RTLD_GLOBAL)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gradflow.torch as hvd  # noqa: E402
import gradflow.torch.elastic as elastic  # noqa: E402

torch.set_num_threads(1)
WORKER = os.environ.get("GRADFLOW_ELASTIC_WORKER", "?")
LOG = os.environ.get("ELASTIC_LOG")
EPOCHS = int(os.environ.get("ELASTIC_EPOCHS", "6"))
KILL = os.environ.get("ELASTIC_KILL", "")
SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))
WAIT_SIZE, _, WAIT_RESETS = os.environ.get("ELASTIC_WAIT", "0:0").partition(":")
WAIT_SIZE, WAIT_RESETS = int(WAIT_SIZE), int(WAIT_RESETS or 0)
KILLS = {int(step) for w, _, step in (k.partition(":") for k in KILL.split(",") if k)
         if w == WORKER}  # steps at which this worker kills itself
SAMPLES = bool(os.environ.get("ELASTIC_SAMPLES"))
BATCH = 32  # per rank
TRACE = bool(os.environ.get("ELASTIC_TRACE"))  # debugging: log every step
DIE_AFTER_FINISH, _, DIE_WHERE = os.environ.get("ELASTIC_DIE_AFTER_FINISH", "").partition(":")
GATE = os.environ.get("ELASTIC_GATE", "")
KILL_AT_GATE = os.environ.get("ELASTIC_KILL_AT_GATE") == WORKER
EXIT_AT_GATE = os.environ.get("ELASTIC_EXIT_AT_GATE") == WORKER
WINDOW_WORKER, _, WINDOW_STEP = os.environ.get("ELASTIC_DIE_IN_WINDOW", "").partition(":")
WINDOW_STEP = int(WINDOW_STEP) if WINDOW_STEP else None


def log(**event):
    event.update(worker=WORKER, t=time.time())
    if LOG:
        # One write of one line: several processes append to their own file.
        with open(os.path.join(LOG, f"worker-{WORKER}.jsonl"), "a") as f:
            f.write(json.dumps(event) + "\n")


def data():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def main():
    if os.environ.get("ELASTIC_DUMP_AFTER"):  # debugging a hang: every thread's stack
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["ELASTIC_DUMP_AFTER"]))
    # The expensive set-up before init(): a worker that joins a running job
    # makes the others wait from the moment it joins until its state sync.
    (xtr, ytr), (xte, yte) = data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    hvd.init()
    log(event="init", size=hvd.size(), rank=hvd.rank())
    # Weight decay: a joiner's fresh optimizer must not move its weights when
    # the state is synced (broadcast_optimizer_state; Horovod's would).
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    variant = os.environ.get("ELASTIC_OPTIMIZER", "")
    options = {"csc": dict(sparse_ratio=0.1, compression=hvd.Compression.fp16),
               "bpps2": dict(backward_passes_per_step=2)}.get(variant, {})
    passes = options.get("backward_passes_per_step", 1)
    amp = os.environ.get("ELASTIC_AMP", "")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2) if amp else None
    if scaler is not None:
        options["grad_scaler"] = scaler
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **options)
    # The third column is each sample's index, for the coverage log.
    dataset = torch.utils.data.TensorDataset(xtr, ytr, torch.arange(len(xtr)))
    sampler = elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    extra = {"scaler": scaler} if amp == "state" else {}
    sched = None
    if os.environ.get("ELASTIC_SCHEDULER"):
        extra["scheduler"] = sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
    state = elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, step=0,
                               grown=False, end_epoch=EPOCHS, resets=0, **extra)
    def on_reset():
        # After restore(), before sync(). sync() broadcasts rank 0's *saved*
        # state (Horovod's ObjectState), so the count is saved here, or
        # every rank would go back to the last commit's count.
        state.resets += 1
        state.save()
        log(event="reset", size=hvd.size(), rank=hvd.rank())

    state.register_reset_callbacks([on_reset])

    @elastic.run
    def train(state):
        log(event="train", size=hvd.size(), rank=hvd.rank(), step=state.step,
            resets=state.resets, grown=state.grown)
        first_step_of_generation = True
        # hvd.size() and the synced reset count are the same on every rank: all
        # agree; the grown group trains at least one epoch
        if not state.grown and hvd.size() >= WAIT_SIZE and state.resets >= WAIT_RESETS:
            state.grown, state.end_epoch = True, max(EPOCHS, state.epoch + 1)
        while state.epoch < state.end_epoch or (not state.grown and state.epoch < 200):
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
            for i, (x, y, idx) in enumerate(loader):
                if state.step in KILLS or (KILL_AT_GATE and os.path.exists(GATE)):
                    log(event="kill", step=state.step)
                    os.kill(os.getpid(), signal.SIGKILL)
                if state.step == WINDOW_STEP:
                    big_allreduce()
                opt.zero_grad()
                # "state": the loop reads the state's scaler each step (it
                # must stay the object the optimizer holds across syncs)
                amp_scaler = state.scaler if amp == "state" else scaler
                for part in torch.chunk(torch.arange(len(x)), passes):
                    loss = F.cross_entropy(model(x[part]), y[part]) * len(part) / len(x)
                    (loss if amp_scaler is None else amp_scaler.scale(loss)).backward()
                if amp_scaler is None:
                    opt.step()
                else:
                    amp_scaler.step(opt)
                    amp_scaler.update()
                if sched is not None:
                    state.scheduler.step()  # the same object as sched (synced in place)
                state.step += 1
                state.batch += 1
                state.sampler.record_batch(i, BATCH)
                if SAMPLES:
                    log(event="batch", epoch=state.epoch, step=state.step, resets=state.resets,
                        size=hvd.size(), rank=hvd.rank(), idx=idx.tolist())
                if first_step_of_generation:
                    g = opt._gradflow
                    log(event="step", step=state.step, size=hvd.size(), rank=hvd.rank(),
                        mode=[g.solo, g.use_pool, g.pool_built, g.csc])
                    first_step_of_generation = False
                elif TRACE:
                    log(event="trace", step=state.step, epoch=state.epoch, batch=state.batch)
                if SLEEP:
                    time.sleep(SLEEP)
                if state.batch % 4 == 0:
                    state.commit()
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()
        if DIE_AFTER_FINISH and DIE_WHERE == "train":
            die_after_finish(DIE_AFTER_FINISH, model)

    try:
        train(state)
    except SystemExit as e:  # ElasticAbort: dismissed, or the job ended
        if EXIT_AT_GATE:
            deadline = time.time() + 120
            while not os.path.exists(GATE) and time.time() < deadline:
                time.sleep(0.05)
            log(event="leave", code=e.code)
        raise
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    log(event="result", rank=hvd.rank(), size=hvd.size(), acc=acc, hash=params_hash(model),
        steps=state.step, scale=scaler.get_scale() if scaler is not None else None,
        lr=opt.param_groups[0]["lr"], sched_epoch=sched.last_epoch if sched is not None else None,
        sched_is_state=sched is None or state.scheduler is sched)
    sys.stdout.write(f"RESULT worker={WORKER} rank={hvd.rank()} size={hvd.size()} "
                     f"acc={acc:.4f}\n")
    sys.stdout.flush()
    if DIE_AFTER_FINISH and DIE_WHERE != "train":
        die_after_finish(DIE_AFTER_FINISH, model)
    who, _, code = os.environ.get("ELASTIC_EXIT_AFTER", "").partition(":")
    if who == WORKER:
        time.sleep(2)
        sys.stderr.write(f"worker {WORKER}: failing after training, code {code}\n")
        sys.exit(int(code))


def big_allreduce():
    """ELASTIC_DIE_IN_WINDOW: a 1 MiB allreduce grows the two-sync windows;
    the chosen worker dies inside the new window's creation."""
    if WORKER == WINDOW_WORKER:
        log(event="kill", step=WINDOW_STEP, where="window")
        FAULT.gf_window_fault_arm(1, 200, hvd.rank())  # SIGKILL 200 ms into the call
    x = torch.arange(1 << 18, dtype=torch.float32) * (hvd.rank() + 1)
    out = hvd.allreduce(x, op=hvd.Sum, name="big")
    n = hvd.size()
    ok = torch.equal(out, torch.arange(1 << 18, dtype=torch.float32) * (n * (n + 1) // 2))
    log(event="big", size=n, rank=hvd.rank(), ok=ok)


def params_hash(model):
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                   for p in model.parameters())).hexdigest()


def die_after_finish(victim, model):
    """A worker dies after another one finished, while a third waits for it
    in a collective (ELASTIC_DIE_AFTER_FINISH). A process set without rank 0
    makes the wait certain: rank 0 can end while ranks 1.. still have a
    collective to do together."""
    log(event="trained", rank=hvd.rank(), size=hvd.size(), hash=params_hash(model))
    pid0 = hvd.broadcast_object(os.getpid(), root_rank=0, name="pid0")
    group = hvd.add_process_set(list(range(1, hvd.size())))
    if hvd.rank() == 0:
        return
    # The victim must die only after the driver has seen rank 0 finish:
    # rank 0's process gone (its proxy reaps it), then its mpiexec's exit.
    deadline = time.time() + 60
    while os.path.exists(f"/proc/{pid0}") and time.time() < deadline:
        time.sleep(0.05)
    if WORKER == victim:
        time.sleep(2)
        log(event="kill", step=-1, rank=hvd.rank())
        os.kill(os.getpid(), signal.SIGKILL)
    log(event="set_wait", rank=hvd.rank())
    try:
        out = hvd.allreduce(torch.ones(4), op=hvd.Sum, process_set=group, name="after_finish")
    except Exception as e:
        log(event="set_error", rank=hvd.rank(), type=type(e).__name__, message=str(e))
        raise
    log(event="set_done", rank=hvd.rank(), value=out.tolist())


if __name__ == "__main__":
    main()
