#!/bin/bash
# The NCCL plugin's own cost, which no in-process arm can show (NCCL loads it for the whole
# process, bare blocks included): the cost mode in three processes, without the plugin, with
# it, without it again (A-B-A, so drift between processes shows). Per-thread CPU of NCCL's
# threads and the bare step time are compared across them. Results: one archive in $OUT.
set -o pipefail
FINAL=$OUT; OUT=/tmp/out; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/results.tgz -C $OUT . ; cp $OUT/*.md $FINAL/ 2>/dev/null' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ENABLE_TIMING=1 OTEL_TRAIN_STALL_TIMEOUT_S=5 PYTHONUNBUFFERED=1
NGPU=${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
PLUGIN_PATH=$(python3 -m otel_train.cli nccl-plugin) || exit 1
cc -O2 -o /tmp/plugin_cost bench/nccl/plugin_cost.c -lpthread -ldl && /tmp/plugin_cost 2 events > $OUT/plugin-cost.json
for run in ${RUNS:-a1 b a2}; do
  mkdir -p $OUT/$run
  if [ "${run#b}" != "$run" ]; then export NCCL_PROFILER_PLUGIN=$PLUGIN_PATH; \
    cp $OUT/plugin-cost.json $OUT/$run/; else unset NCCL_PROFILER_PLUGIN; fi
  # b<ms>: the plugin with its poller's interval at <ms> (OTEL_TRAIN_NCCL_POLL_MS)
  if [ -n "${run#b}" ] && [ "${run#b}" -eq "${run#b}" ] 2>/dev/null; then
    export OTEL_TRAIN_NCCL_POLL_MS=${run#b}; else unset OTEL_TRAIN_NCCL_POLL_MS; fi
  # bh: the plugin completing finished launches on the enqueuing thread too
  # (OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE=1; off by default since call 22); every b run times the plugin's
  # callbacks in situ (OTEL_TRAIN_NCCL_SELF_TIME=1, run.py's otel-nccl-enqueue)
  if [ "$run" = bh ]; then export OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE=1; else unset OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE; fi
  if [ "${run#b}" != "$run" ]; then export OTEL_TRAIN_NCCL_SELF_TIME=1; else unset OTEL_TRAIN_NCCL_SELF_TIME; fi
  echo "== $run NCCL_PROFILER_PLUGIN=${NCCL_PROFILER_PLUGIN:-unset} $(date +%T)"
  timeout ${RUN_TIMEOUT:-170} torchrun --standalone --nproc-per-node $NGPU bench/multigpu/run.py \
    --out $OUT/$run ${RUN_ARGS:---modes cost --cost-arms default --cost-repeats 2} 2>&1 \
    | grep -v '^{' > $OUT/$run/run.log
  rm -rf $OUT/$run/cost-* $OUT/$run/normal
done
python3 - $OUT <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["# NCCL plugin A-B-A: bare blocks per step, by process", ""]
for run in sorted(p.name for p in out.iterdir() if p.is_dir()):
    for f in sorted((out / run).glob("result-rank*.json")):
        d = json.loads(f.read_text())
        per = d["modes"]["cost"]["per_step"]
        for arm in per:
            t = per[arm]["threads_s"]
            lines.append(f"- {run} rank {d['rank']} {arm}: wall {[round(1e3 * w, 1) for w in per[arm]['wall_s']]} ms; "
                         f"process CPU {[round(1e3 * c, 1) for c in per[arm]['cpu_s']]} ms; threads (ms) "
                         + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]) if v > 0))
(out / "aba.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
for run in $(ls $OUT | grep '^b'); do
  for base in a1 a2; do
    [ -d $OUT/$base ] || continue
    python3 bench/multigpu/verdict.py $OUT/$run --baseline $OUT/$base \
      --out $OUT/verdict-$run-vs-$base.md | tail -3
  done
done
