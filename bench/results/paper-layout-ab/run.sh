#!/bin/bash
# Same-sitting paper before/after: the tree before the layout step (ae6b03e) and after (main).
set -u
OLD=/work/old/target/release/ringtier
NEW=/work/new-ringtier
OUT=/work/paper_ab
mkdir -p $OUT
for round in 1 2; do
  for side in old new; do
    B=$OLD; [ $side = new ] && B=$NEW
    echo "== round $round $side $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    flock /tmp/ringtier-bench.lock $B paper --out $OUT/$side-$round --work /work/paper_work_$side > $OUT/$side-$round.log 2>&1
    echo "rc=$?"
    rm -rf /work/paper_work_$side
  done
done
