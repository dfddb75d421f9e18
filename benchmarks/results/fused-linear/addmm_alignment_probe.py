import torch, time
torch.set_num_threads(1)
g = torch.randn(32, 4096); x = torch.randn(32, 4096)
def bench(c, n=8):
    c.addmm_(g.t(), x)
    t=time.perf_counter()
    for _ in range(n): c.addmm_(g.t(), x)
    return (time.perf_counter()-t)/n*1e3
buf = torch.zeros(4096*4096 + 4096)
print("base%4096", buf.data_ptr()%4096)
res=[]
for off in list(range(0,17))+[24,32,48,64,1024]:
    v = buf[off:off+4096*4096].view(4096, 4096)
    res.append(f"{off}:{bench(v):.1f}")
print(" ".join(res))
