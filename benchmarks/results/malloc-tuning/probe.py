"""One-process probe of glibc malloc tuning (docs/performance.md, "glibc malloc
tuning"): forward + backward of two 4096 x 4096 nn.Linear, batch 32, one
thread; median of 15 steps. Run with and without
MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=17179869184."""
import time, torch
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096))
x = torch.randn(32, 4096)
def step(mode):
    if mode == "none":
        m.zero_grad(set_to_none=True)
    else:
        m.zero_grad(set_to_none=False)
    m(x).sum().backward()
for mode in ("none", "zero"):
    for _ in range(3): step(mode)
    ts = []
    for _ in range(15):
        t0 = time.perf_counter(); step(mode); ts.append(time.perf_counter() - t0)
    ts.sort(); print(mode, f"{ts[len(ts)//2]*1e3:.1f} ms")
