# tests/parallel/hvd_torch_compat_script.py — an unmodified Horovod PyTorch
# training script (it imports horovod, never gradflow), run by
# test_horovod_compat_mode.py under `gradflowrun --horovod-compat` and under
# plain mpiexec with GRADFLOW_HOROVOD_COMPAT=1. Usage: script.py OUT_DIR.
# Each rank seeds its model differently, so broadcast_parameters must work
# for the ranks to agree; rank 0 prints the averaged metric and checkpoints.
import hashlib
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import horovod
import horovod.torch as hvd

from hvd_compat_data import BASE_LR, BATCH, EPOCHS, regression_data, torch_model

out_dir = sys.argv[1]
hvd.init()
torch.set_num_threads(1)

x, y = regression_data()
dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

model = torch_model(seed=1234 + hvd.rank())
optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.none, op=hvd.Average)

for epoch in range(EPOCHS):
    total = 0.0
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item()
    avg = hvd.allreduce(torch.tensor(total / len(loader)), name="avg_loss").item()
    if hvd.rank() == 0:
        print(f"epoch {epoch} avg_loss {avg!r}", flush=True)
        torch.save(model.state_dict(), os.path.join(out_dir, "checkpoint.pt"))

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
print(f"rank {hvd.rank()} of {hvd.size()} params {hashlib.sha256(flat.tobytes()).hexdigest()} "
      f"horovod {horovod.__version__} module {hvd.__name__}", flush=True)
