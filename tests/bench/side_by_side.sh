#!/usr/bin/env bash
# Times commits of this repository (or folders holding a tree) side by side on one GPU machine: each
# is unpacked with git archive (or copied) into a folder of its own, gets `kembed` on a PYTHONPATH of its own (as on_device.sh makes it), and
# runs bench_lone_step.py (this tree's) in a process of its own; the processes take turns round by
# round. `bash tests/bench/side_by_side.sh "old:84f661d new:HEAD" --backend triton --rounds 3`.
# Wheels from .whl/ (see docs/benchmarks.md) are installed first; $OUT (default /tmp/sides) gets each
# process's log, the rounds as JSON lines and the summary.
set -euo pipefail
pairs=$1
shift
out=${OUT:-/tmp/sides}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
labels=""
for pair in $pairs; do
  label=${pair%%:*}
  tree=/tmp/trees/$label
  rm -rf "$tree" "/tmp/shim-$label" && mkdir -p "$tree" "/tmp/shim-$label/kembed"
  if [ -d "${pair#*:}" ]; then cp -r "${pair#*:}/." "$tree"; else git archive "${pair#*:}" | tar -x -C "$tree"; fi
  for p in gateway:gateway worker:worker proto:proto operator:operator/kembed_operator monitoring:monitoring; do
    ln -sfn "$tree/${p#*:}" "/tmp/shim-$label/kembed/${p%%:*}"
  done
  labels="$labels${labels:+,}$label"
done
rm -rf /tmp/turns && mkdir -p /tmp/turns && echo "${labels%%,*} 0" >/tmp/turns/turn
rm -f "$out/lone.jsonl"
pids=()
for pair in $pairs; do
  label=${pair%%:*}
  PYTHONPATH=/tmp/shim-$label:/tmp/site PYTHONUNBUFFERED=1 python3 -P tests/bench/bench_lone_step.py \
    --label "$label" --turns /tmp/turns --order "$labels" --json "$out/lone.jsonl" "$@" >"$out/$label.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for pair in $pairs; do echo "== ${pair%%:*}"; grep -v "^|" "$out/${pair%%:*}.log" | tail -4; done
PYTHONPATH=/tmp/shim-${labels##*,}:/tmp/site python3 -P tests/bench/bench_lone_step.py --summarize "$out/lone.jsonl" \
  | tee "$out/summary.md"
exit $status
