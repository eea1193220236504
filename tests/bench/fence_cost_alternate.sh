#!/bin/sh
# Issue 30 item 5: the write intents' cost, before and after, alternating row by row in one
# sitting (tests/bench/fence_cost.py for each run; one JSON line per run on stdout).
# Usage: fence_cost_alternate.sh BEFORE_CONTROLLER AFTER_CONTROLLER ROUNDS
#   SANDBOX (default target/debug/sandbox-apiserver) and OUT_DIR as fence_cost.py reads them.
# Rows: N MODE LEADER_ELECT HANDOVER TAG.
set -eu
before=$1 after=$2 rounds=${3:-1}
here=$(dirname "$0")
round=1
while [ "$round" -le "$rounds" ]; do
  while read -r n mode le handover tag; do
    for side in before after; do
      eval ctl=\$$side
      python3 "$here/fence_cost.py" "$ctl" "$n" "$mode" "$le" "$handover" "$tag-$round-$side"
    done
  done <<ROWS
2000 unlimited true 0 2k
10000 unlimited true 0 10k
2000 unlimited true 1 handover2k
1000 default true 0 1k-20qps
2000 unlimited false 0 nole2k
ROWS
  round=$((round + 1))
done
