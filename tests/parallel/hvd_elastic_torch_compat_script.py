"""An elastic Horovod PyTorch script as Horovod's elastic examples write one
(our own code, shaped like them): `import horovod.torch as hvd`, a sampler
made from hvd.size() at start, `hvd.elastic.TorchState(model, optimizer,
epoch=, batch=)`, a reset callback that rescales the learning rate by
hvd.size(), `@hvd.elastic.run` with a commit per batch, then a metric
averaged with hvd.allreduce. Run by test_horovod_compat_mode.py under
`gradflowrun --horovod-compat --min-np 2 --max-np 3 --host-discovery-script`.

argv: OUT_DIR [KILL_RANK]. With KILL_RANK, that rank SIGKILLs itself once,
in epoch 1 after step 3 and before its commit (a marker file in OUT_DIR
makes it once). Each rank ends with one line: `rank R of N params SHA lr LR
resets K epoch E first_loss A last_loss B test_loss C`."""
import hashlib
import os
import signal
import sys

import torch
import torch.nn.functional as F

import horovod.torch as hvd

out_dir = sys.argv[1]
kill_rank = int(sys.argv[2]) if len(sys.argv) > 2 else None
EPOCHS, BATCH, BASE_LR = 3, 16, 0.05

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

# A learnable task: 10 classes, each a direction in 20-d space, plus noise.
g = torch.Generator().manual_seed(0)
centers = torch.randn(10, 20, generator=g)
y_all = torch.randint(0, 10, (480,), generator=g)
x_all = centers[y_all] + 0.5 * torch.randn(480, 20, generator=g)
train_set = torch.utils.data.TensorDataset(x_all[:384], y_all[:384])
test_set = torch.utils.data.TensorDataset(x_all[384:], y_all[384:])
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_set, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH, sampler=train_sampler)

model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=0.5)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
losses = []
resets = [0]


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, EPOCHS):
        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch
        for state.batch, (x, y) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break
            state.optimizer.zero_grad()
            loss = F.cross_entropy(state.model(x), y)
            loss.backward()
            state.optimizer.step()
            losses.append(loss.item())
            marker = os.path.join(out_dir, "killed")
            if (hvd.rank() == kill_rank and state.epoch == 1 and state.batch == 3
                    and not os.path.exists(marker)):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            state.commit()
        state.batch = 0


def on_state_reset():
    resets[0] += 1
    for group in optimizer.param_groups:
        group["lr"] = BASE_LR * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)

with torch.no_grad():
    test_loss = F.cross_entropy(model(test_set.tensors[0]), test_set.tensors[1]).item()
test_loss = hvd.allreduce(torch.tensor(test_loss), name="avg_loss").item()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
sys.stdout.write(f"rank {hvd.rank()} of {hvd.size()} params {digest.hexdigest()} "
                 f"lr {optimizer.param_groups[0]['lr']:.4f} resets {resets[0]} "
                 f"epoch {state.epoch} first_loss {losses[0]:.5f} last_loss {losses[-1]:.5f} "
                 f"test_loss {test_loss:.5f}\n")
sys.stdout.flush()
