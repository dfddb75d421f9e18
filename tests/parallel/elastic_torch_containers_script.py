# elastic_torch_containers_script.py — SPMD (test_elastic.py), under plain
# mpiexec: TorchState given a GAN's models and optimizers in containers
# (models=[g, d], optimizers={"g": ..., "d": ...}). Each rank builds its
# models from its own seed (as a joining worker would); after elastic.run's
# first sync every rank's own models must hold rank 0's weights, and a few
# training steps keep them bitwise identical. Before, a container was a
# plain object pickled whole: ranks > 0 got copies in state.models while
# the models their loop trained kept their own weights (silently different
# parameters), and a container of DistributedOptimizers raised PicklingError
# on rank 0. A container mixing such objects with plain ones raises
# ValueError at construction. Prints "OK" on every rank.
import hashlib
import sys
import warnings

import torch

import gradflow.torch as hvd
from gradflow.torch import elastic

warnings.simplefilter("ignore")
torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
KIND = sys.argv[1]  # "models" (optimizers by keyword) | "both" (containers for both)

torch.manual_seed(100 + R)  # each rank its own initial weights
g, d = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
rank0 = hvd.broadcast_object([p.detach().clone() for p in list(g.parameters()) + list(d.parameters())],
                             root_rank=0, name="rank0_weights")
opt_g = hvd.DistributedOptimizer(torch.optim.SGD(g.parameters(), lr=0.1, momentum=0.9),
                                 named_parameters=g.named_parameters())
opt_d = hvd.DistributedOptimizer(torch.optim.Adam(d.parameters(), lr=0.01),
                                 named_parameters=d.named_parameters())
if KIND == "both":
    state = elastic.TorchState(models=[g, d], optimizers={"g": opt_g, "d": opt_d}, step=0)
else:
    state = elastic.TorchState(models=(g, d), opt_g=opt_g, opt_d=opt_d, step=0)


def digest():
    h = hashlib.sha1()
    for p in list(g.parameters()) + list(d.parameters()):
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


@elastic.run
def train(state):
    synced = [p.detach().clone() for p in list(g.parameters()) + list(d.parameters())]
    for step in range(3):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 * step + R))
        opt_d.zero_grad()
        d(g(x).detach()).pow(2).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        (-d(g(x)).mean()).backward()
        opt_g.step()
        state.step += 1
        state.commit()
    return synced


synced = train(state)
for a, b in zip(synced, rank0):
    assert torch.equal(a, b), f"rank {R}: its own model did not get rank 0's weights at the sync"
assert state.models[0] is g and state.models[1] is d
digests = hvd.allgather_object(digest(), name="digests")
assert len(set(digests)) == 1, f"ranks differ after training: {digests}"
try:
    elastic.TorchState(g, opt_g, extras=[d, 0.5])
    raise AssertionError("a container mixing a model and a number was accepted")
except ValueError as e:
    assert "'extras'" in str(e), e
print("OK", flush=True)
hvd.shutdown()
