"""Exact Belady (MIN, demand fetch, bypass) replayed on shuffled epochs for the first node of a
job of NODES x 4 ranks (ranks in lockstep: rank k reads its p-th sample at p * 4 + k), against
static (c). Used in docs/CACHE.md for what the clairvoyant policy could reach (issue 30):
    python3 bench/results/cache/belady_replay.py
"""
import random, heapq
def run(N, c, epochs, nodes, local=4, seed=1, window=None):
    rng = random.Random(seed)
    W = nodes*local
    seq=[]
    for e in range(epochs):
        o = list(range(N)); rng.shuffle(o)
        shards = [o[r::W] for r in range(local)]  # node 0's ranks
        L = max(len(s) for s in shards)
        for p in range(L):
            for s in shards:
                if p < len(s): seq.append(s[p])
    per = len(seq)//epochs
    T=len(seq); nxt=[0]*T; last={}
    for t in range(T-1,-1,-1):
        x=seq[t]; nxt[t]=last.get(x,10**9); last[x]=t
    cap=int(N*c); cache={}; heap=[]; hits=[0]*epochs
    for t,x in enumerate(seq):
        e=t//per; n=nxt[t]
        if window and n - t > window*per: n = 10**9
        if x in cache:
            hits[e]+=1
        if n>=10**9:
            cache.pop(x, None); continue
        if x in cache or len(cache)<cap:
            cache[x]=n; heapq.heappush(heap,(-n,x)); continue
        while True:
            nn,y=heap[0]
            if y in cache and cache[y]==-nn: break
            heapq.heappop(heap)
        if -heap[0][0]>n:
            heapq.heappop(heap); del cache[y]; cache[x]=n; heapq.heappush(heap,(-n,x))
    return [round(h/per,3) for h in hits]
if __name__ == "__main__":
    for nodes in (1, 4):
        for c in (0.1, 0.25):
            r = [run(4000, c, 4, nodes, seed=s, window=3) for s in range(3)]
            warm = [sum(x[1:]) / 3 for x in r]
            print(f"nodes {nodes} c {c}: reuse per epoch {r}; warm reuse {[round(w, 3) for w in warm]}; "
                  f"slow-tier bytes vs static {[round((1 - w) / (1 - c), 3) for w in warm]}")
