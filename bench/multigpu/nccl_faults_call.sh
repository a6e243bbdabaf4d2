#!/bin/bash
# One device call on the one-GPU machine (the `device` tool; carry `.whl`, the cp312 wheels
# otel-train needs there, docs/gpu.md): the C tracker built for the device's Python, the
# multi-rank NCCL tests (several ranks sharing GPU 0), the other GPU tests, then the 8-rank
# proof (bench/multigpu/nccl_faults.py). Everything lands under $OUT.
#   TESTS (tests/gpu/test_nccl_attribution.py; 0 skips), GPU_TESTS (0; 1 also runs tests/gpu),
#   RANKS (8), FAULTS (hang,cpu,gpu,data; empty skips the proof), COST_RANKS (empty; e.g. 2,4,8)
set -u
source bench/device_setup.sh
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
mkdir -p /tmp/pt /tmp/proof
if [ "${TESTS:-tests/gpu/test_nccl_attribution.py}" != 0 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest ${TESTS:-tests/gpu/test_nccl_attribution.py} \
    -q -p no:cacheprovider -rfEs --basetemp=/tmp/pt ${PYTEST_K:+-k "$PYTEST_K"} \
    > "$OUT/pytest-nccl.txt" 2>&1
  echo "nccl tests rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest-nccl.txt" | tail -12
fi
if [ "${GPU_TESTS:-0}" != 0 ]; then
  timeout "${GPU_TEST_TIMEOUT:-240}" python3 -m pytest tests/gpu -q -p no:cacheprovider -rfEs \
    --deselect tests/gpu/test_nccl_attribution.py > "$OUT/pytest-gpu.txt" 2>&1
  echo "gpu tests rc=$?"; tail -4 "$OUT/pytest-gpu.txt"
fi
if [ -n "${FAULTS-hang,cpu,gpu,data}" ]; then
  timeout "${PROOF_TIMEOUT:-330}" python3 bench/multigpu/nccl_faults.py --ranks "${RANKS:-8}" \
    --out /tmp/proof --faults "${FAULTS-hang,cpu,gpu,data}" --cost-ranks "${COST_RANKS:-}" \
    --md "$OUT/nccl-faults.md" > "$OUT/proof.log" 2>&1
  echo "proof rc=$?"; grep -E "^\| |verdict|Error|error" "$OUT/proof.log" | cut -c1-600 | tail -20
  cp /tmp/proof/nccl-faults.json "$OUT/" 2>/dev/null
fi
find /tmp/pt -name 'report.json' | head -40 | tar czf "$OUT/reports.tgz" -T - 2>/dev/null
(cd /tmp/proof && find . -name '*.log' -o -name '*.jsonl' | head -200 | tar czf "$OUT/proof-runs.tgz" -T -) 2>/dev/null
ls -la "$OUT"
