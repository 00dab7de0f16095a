import json, os, subprocess, sys, time, glob
sys.path.insert(0, "/work/main/bench")
from benchlib import evict
CHILD = r'''
import sys, time, resource, ringtier
d, fmt, order = sys.argv[1:4]
loader = ringtier.RecordLoader(d, format=fmt, order=order)
t0 = time.perf_counter(); c0 = time.process_time()
n = b = 0
for rec in loader.epoch(0):
    b += len(rec); n += 1
w = time.perf_counter() - t0; c = time.process_time() - c0
print(f"{b / w / 1e6:.0f} MB/s {c / (b / 2**30):.2f} CPU s/GiB peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB")
'''
d, fmt, order, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
files = [f for f in glob.glob(d + "/*") if f.endswith((".tar", ".tfrecord"))]
for r in range(rounds):
    for v in ["base", "new2"]:
        evict(files)
        env = dict(os.environ, PYTHONPATH=f"/work/data-h18/py-{v}")
        out = subprocess.run([sys.executable, "-c", CHILD, d, fmt, order], env=env, capture_output=True, text=True)
        print(r, v, fmt, order, out.stdout.strip() or out.stderr[-300:], os.getloadavg()[0], flush=True)
