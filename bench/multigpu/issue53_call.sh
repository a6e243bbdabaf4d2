#!/bin/bash
# Device calls (the `device` tool; carry `.whl`): issue 53 on the GPU. SINGLE=1: the
# single-GPU tests of GPU work between the phases, regions and the CUDA-timed phases;
# NCCL_TESTS=1: the NCCL tests of GPU work between the phases, a named region and the CPU
# straggler at 2 and 4 ranks sharing GPU 0; PROOF=1: the 8-rank proof
# (bench/multigpu/nccl_faults.py) of gpu_between, region and CPU_RUNS (2) CPU-straggler runs
# in steps 10-12. Logs, the proof's JSON and Markdown, each run's report and the late rank's
# traces under $OUT. Each part has its own time limit: one call of 600 s holds SINGLE and
# NCCL_TESTS, another PROOF.
set -u
source bench/device_setup.sh
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 COLUMNS=220
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))' | tee "$OUT/versions.txt"
if [ "${SINGLE:-1}" != 0 ]; then
  timeout "${SINGLE_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -x \
    tests/gpu/test_gpu_outside_phases.py tests/gpu/test_gaps_gpu.py tests/gpu/test_cuda_timing.py \
    tests/gpu/test_no_sync.py \
    > "$OUT/tests-single.log" 2>&1
  echo "single rc=$?"; tail -3 "$OUT/tests-single.log"
fi
if [ "${NCCL_TESTS:-1}" != 0 ]; then
  timeout "${NCCL_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rA \
    tests/gpu/test_nccl_attribution.py -k "${NCCL_K:-gpu_work_queued or cpu_straggler or region_the_user}" \
    > "$OUT/tests-nccl.log" 2>&1
  echo "nccl tests rc=$?"; grep -E "PASSED|FAILED|passed|failed" "$OUT/tests-nccl.log" | tail -8
fi
if [ "${PROOF:-1}" != 0 ]; then
  faults="gpu_between,region,$(printf 'cpu,%.0s' $(seq "${CPU_RUNS:-2}"))"
  timeout "${PROOF_TIMEOUT:-420}" python3 bench/multigpu/nccl_faults.py --ranks "${RANKS_PROOF:-8}" \
    --out /tmp/proof --faults "$faults" --fault-steps cpu=10,11,12 \
    --md "$OUT/proof.md" > "$OUT/proof.log" 2>&1
  echo "proof rc=$?"; grep -E "^\| |verdict" "$OUT/proof.log" | cut -c1-600 | tail -12
  cp /tmp/proof/nccl-faults.json "$OUT/nccl-faults.json" 2>/dev/null
  last=$(( ${RANKS_PROOF:-8} - 1 ))
  (cd /tmp/proof && tar czf "$OUT/proof-runs.tgz" */report.json */torchrun.log \
    */*/traces.rank-$last.jsonl */*/logs.rank-$last.jsonl) 2>/dev/null
fi
ls -la "$OUT"
