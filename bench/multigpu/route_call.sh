#!/bin/bash
# One device call on the one-GPU machine for the timing routes (carry `.whl`, the cp312
# wheels otel-train needs there): the C tracker built for the device's Python, the NCCL
# plugin and attribution tests on ranks sharing GPU 0 (the plugin's auto choice), then
# bench/multigpu/route_cost.py. Everything lands under $OUT. TESTS=0 skips the tests.
set -u
source bench/device_setup.sh
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
if [ "${TESTS:-1}" != 0 ]; then
  timeout "${TEST_TIMEOUT:-280}" python3 -m pytest ${TEST_FILES:-tests/gpu/test_nccl_attribution.py tests/gpu/test_nccl_profiler_plugin.py} \
    -q -p no:cacheprovider -rfEs --basetemp=/tmp/pt > "$OUT/pytest-nccl.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest-nccl.txt" | tail -12
fi
mkdir -p /tmp/rc
timeout "${COST_TIMEOUT:-300}" python3 bench/multigpu/route_cost.py --ranks "${RANKS:-2,4}" \
  --out /tmp/rc --md "$OUT/route-cost.md" ${COST_ARGS:-} > "$OUT/route-cost.log" 2>&1
echo "route cost rc=$?"; grep -E "^\||verdict|Error" "$OUT/route-cost.log" | cut -c1-400 | tail -14
cp /tmp/rc/route-cost.json "$OUT/" 2>/dev/null
(cd /tmp/rc && find . -name torchrun.log | head -30 | tar czf "$OUT/route-logs.tgz" -T -) 2>/dev/null
