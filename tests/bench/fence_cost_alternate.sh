#!/bin/sh
# Issue 30 item 5: the write intents' cost, the builds alternating run by run in one sitting
# (tests/bench/fence_cost.py for each run; one JSON line per run on stdout, tagged
# ROW-ROUND-NAME).
# Usage: fence_cost_alternate.sh ROUNDS NAME=CONTROLLER [NAME=CONTROLLER ...]
#   SANDBOX (default target/debug/sandbox-apiserver) and OUT_DIR as fence_cost.py reads them;
#   ROWS (default: all of them below) picks rows by tag, e.g. ROWS="2k 10k".
# Rows: N MODE LEADER_ELECT HANDOVER TAG (MODE unlimited: --kube-api-qps/burst 100000; default:
# the controller's 20/30).
set -eu
rounds=$1
shift
here=$(dirname "$0")
rows=${ROWS:-"2k 10k handover2k 1k-20qps nole2k"}
round=1
while [ "$round" -le "$rounds" ]; do
  while read -r n mode le handover tag; do
    case " $rows " in *" $tag "*) ;; *) continue ;; esac
    for build in "$@"; do
      name=${build%%=*} ctl=${build#*=}
      python3 "$here/fence_cost.py" "$ctl" "$n" "$mode" "$le" "$handover" "$tag-$round-$name"
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
