# 4 plain-torch processes on 2 cores: does an extra 100 MB accumulation pass per step slow the matmuls?
import sys, time, torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1); torch.manual_seed(0)
mode = sys.argv[1]
m = nn.Sequential(nn.Linear(1024,4096), nn.ReLU(), nn.Linear(4096,4096), nn.ReLU(), nn.Linear(4096,1024), nn.ReLU(), nn.Linear(1024,10))
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(32,1024); y = torch.randint(0,10,(32,))
if mode == "pool":
    for p in m.parameters(): p.grad = torch.zeros_like(p)   # persistent .grad: autograd accumulates (add_)
steps = int(sys.argv[2]); t0 = time.time()
for i in range(steps):
    if mode != "pool": opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x), y); loss.backward(); opt.step()
    if mode == "pool":
        for p in m.parameters(): p.grad.mul_(0.5)   # keep a "residual" (nonzero) like the CSC pool
print(mode, f"{(time.time()-t0)/steps*1e3:.1f} ms/step", flush=True)
