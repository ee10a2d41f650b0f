#!/usr/bin/env bash
# A/B of two checkouts on one command, for a machine whose speed drifts: alternate runs of
# `python -m analyzer ARGS...` from OLD and from NEW (each with PYTHONPATH set to its checkout),
# N each, and print the median and best wall time, median CPU (user + sys) and the largest
# process's peak RSS of each side.
#   bench/ab.sh OLD_CHECKOUT NEW_CHECKOUT N diagnose /tmp/tracecliff-scale --cache-dir DIR --format text -o /dev/null
# Run it with the project's environment active (its `python`); a cached command needs its
# cache filled once per side first (the cache key covers the code).
set -euo pipefail
old=$1 new=$2 n=$3
shift 3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for _ in $(seq "$n"); do
  for side in old new; do
    dir=${!side}
    if ! (cd "$dir" && PYTHONPATH="$dir" /usr/bin/time -f "%e %U %S %M" -a -o "$out/$side" \
          python -m analyzer "$@" > /dev/null 2>&1); then
      echo "ab.sh: a run from $dir failed: rerun the command there to see why" >&2
      exit 2
    fi
  done
done
python3 - "$out" <<'PY'
import statistics, sys
for side in ("old", "new"):
    rows = [list(map(float, line.split())) for line in open(f"{sys.argv[1]}/{side}") if line[:1].isdigit()]
    wall = [r[0] for r in rows]
    cpu = [r[1] + r[2] for r in rows]
    rss = [r[3] / 1024 for r in rows]
    print(f"{side}: wall median {statistics.median(wall):.2f} s, best {min(wall):.2f} s; "
          f"CPU median {statistics.median(cpu):.2f} s; largest process {statistics.median(rss):.0f} MB; runs {len(wall)}")
PY
