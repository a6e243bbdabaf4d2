#!/bin/bash
# One device call (the `device` tool; carry `.whl`, the cp312 wheels otel-train needs there,
# docs/gpu.md): the worked example of docs/compare.md. Eager and compiled FSDP2, RANKS (2)
# NCCL ranks sharing GPU 0, STEPS (60) steps each, then `otel-train compare` on the two runs:
# its table, JSON and HTML and the compiled run's report, under $OUT (COMPARE=0 skips it). CPU_RUNS (0): then that many
# 8-rank runs of the CPU straggler (tests/gpu/nccl_faults_train.py, FAULT=cpu) in steps 10-12.
set -u
source bench/device_setup.sh
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 COLUMNS=220
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))' | tee "$OUT/versions.txt"
rm -rf /tmp/cmp; mkdir -p /tmp/cmp
if [ "${COMPARE:-1}" != 0 ]; then
for cfg in eager compiled; do
  flag=""; [ "$cfg" = compiled ] && flag=--compiled
  timeout "${RUN_TIMEOUT:-240}" torchrun --standalone --nproc-per-node "${RANKS:-2}" \
    bench/multigpu/compare_example.py --out /tmp/cmp --run-id "$cfg" --steps "${STEPS:-60}" \
    $flag > "$OUT/run-$cfg.log" 2>&1
  echo "$cfg rc=$?"; grep -v "^\s*$" "$OUT/run-$cfg.log" | tail -3
done
python3 -m otel_train.cli compare /tmp/cmp/eager /tmp/cmp/compiled --gate step_time=off \
  --gate samples_per_s=off > "$OUT/compare.txt" 2>&1; echo "compare rc=$?"
python3 -m otel_train.cli compare /tmp/cmp/eager /tmp/cmp/compiled --json > "$OUT/compare.json"
python3 -m otel_train.cli compare /tmp/cmp/eager /tmp/cmp/compiled --html "$OUT/compare.html" \
  > /dev/null
python3 -m otel_train.cli report /tmp/cmp/compiled > "$OUT/report-compiled.txt" 2>&1
cat "$OUT/compare.txt"
fi
ls -la "$OUT"
# the CPU straggler at 8 ranks, three steps in a row (issue 53: its line lost now and then):
# CPU_RUNS runs of it, each asserting the line in every injected step
if [ "${CPU_RUNS:-0}" != 0 ]; then
  faults=$(printf 'cpu,%.0s' $(seq "$CPU_RUNS"))
  timeout "${PROOF_TIMEOUT:-300}" python3 bench/multigpu/nccl_faults.py --ranks "${RANKS_CPU:-8}" \
    --out /tmp/proof --faults "$faults" --fault-steps cpu=10,11,12 \
    > "$OUT/proof-cpu.log" 2>&1
  echo "cpu proof rc=$?"; grep -E "^\| cpu|verdict" "$OUT/proof-cpu.log" | cut -c1-900
  cp /tmp/proof/nccl-faults.json "$OUT/nccl-cpu-straggler.json" 2>/dev/null
  # each run's report, and the late rank's traces and logs (its gap events: what the
  # sampler saw in each injected step)
  (cd /tmp/proof && tar czf "$OUT/cpu-reports.tgz" */report.json \
    */*/traces.rank-$(( ${RANKS_CPU:-8} - 1 )).jsonl */*/logs.rank-$(( ${RANKS_CPU:-8} - 1 )).jsonl) 2>/dev/null
fi
