#!/bin/bash
set -u
OUT=/work/paper_ab
for side in new old; do
  B=/work/old-ringtier; [ $side = new ] && B=/work/new2-ringtier
  echo "== fadvise $side $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  RINGTIER_COLD=fadvise flock /tmp/ringtier-bench.lock $B paper --out $OUT/$side-fadvise --work /work/paper_work_f$side > $OUT/$side-fadvise.log 2>&1
  echo "rc=$? end $(date +%T)"
  rm -rf /work/paper_work_f$side
done
