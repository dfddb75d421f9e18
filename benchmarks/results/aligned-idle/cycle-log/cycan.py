import sys, re, statistics as stt
N=int(sys.argv[2]) if len(sys.argv)>2 else 4
rows=[]
for r in range(N):
    L=[]
    for line in open(f"{sys.argv[1]}.{r}"):
        p=line.split(); d=dict(x.split('=') for x in p[2:])
        L.append((float(p[0]),float(p[1]),int(d['fresh']),int(d['pend']),int(d['resp']),int(d['idle'])))
    rows.append(L)
n=min(len(L) for L in rows)
start=n//3  # skip warmup-ish
idle_w=[];work_w=[];idle_skew=[];work_skew=[];last_rank=[0]*N
tot_wait_idle=0;tot_wait_work=0
for i in range(start,n):
    ent=[rows[r][i][0] for r in range(N)]; ex=[rows[r][i][1] for r in range(N)]
    resp=rows[0][i][4]
    sk=max(ent)-min(ent)
    w=sum(ex[r]-ent[r] for r in range(N))
    if resp==0: idle_skew.append(sk); tot_wait_idle+=w
    else: work_skew.append(sk); tot_wait_work+=w
    last_rank[ent.index(max(ent))]+=1
T=rows[0][n-1][1]-rows[0][start][0]
print("cycles",n-start,"idle",len(idle_skew),"work",len(work_skew),"span s %.2f"%T)
q=lambda a:[round(x*1e3,2) for x in (min(a),stt.median(a),max(a))] if a else None
print("idle entry skew ms min/med/max",q(idle_skew)," total wait in idle cycles (all ranks) ms %.1f"%(tot_wait_idle*1e3))
print("work entry skew ms min/med/max",q(work_skew)," total wait in work cycles ms %.1f"%(tot_wait_work*1e3))
print("last to enter, by rank", last_rank)
# sample sequence
for i in range(n-40,n-20):
    print(i, ' '.join("%.2f/%.2f%s"%((rows[r][i][0]-rows[0][i][0])*1e3,(rows[r][i][1]-rows[r][i][0])*1e3, ('*' if rows[r][i][2] else '')+('p%d'%rows[r][i][3] if rows[r][i][3] else '')) for r in range(N)), 'resp',rows[0][i][4],'idle',[rows[r][i][5] for r in range(N)], 'gap_prev %.2f'%((rows[0][i][0]-rows[0][i-1][1])*1e3))
# Share of idle-exchange entry offsets (> 0.5 ms, against the earliest rank)
# within 0.25 ms of a multiple of the 4 ms scheduler tick (chance: 12.5 %).
near = tot = 0
for i in range(start, n):
    if rows[0][i][4] != 0:
        continue
    ent = [rows[r][i][0] for r in range(N)]
    for e in ent:
        o = (e - min(ent)) * 1e3
        if o < 0.5:
            continue
        tot += 1
        k = round(o / 4.0)
        near += k >= 1 and abs(o - 4 * k) <= 0.25
print("offsets >0.5ms: %d; within 0.25 ms of a 4 ms multiple: %d (%.0f%%); chance 12.5%%" % (tot, near, 100 * near / tot))
