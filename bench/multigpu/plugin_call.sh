#!/bin/bash
# One device call for the NCCL plugin (issue 15): its GPU test, the GPU tests of the default
# (flight-recorder) path, the A-B-A cost (bench/multigpu/plugin_aba.sh), then with the plugin
# a normal run (checked) and the paired overhead rounds. Results: archives in $OUT.
set -o pipefail
FINAL=$OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/tests
timeout 120 python3 -m pytest tests/gpu/test_nccl_profiler_plugin.py -q -p no:cacheprovider -rA \
  > /tmp/tests/pytest-plugin.txt 2>&1; echo "plugin test rc=$?"; tail -3 /tmp/tests/pytest-plugin.txt
timeout 220 python3 -m pytest tests/gpu -q -p no:cacheprovider -rA \
  --ignore=tests/gpu/test_nccl_profiler_plugin.py > /tmp/tests/pytest-gpu.txt 2>&1
echo "gpu tests rc=$?"; tail -3 /tmp/tests/pytest-gpu.txt
RUNS="a1 b" bash bench/multigpu/plugin_aba.sh | grep -v "^verdict" | tail -12
mv $FINAL/results.tgz /tmp/tests/aba.tgz
cp /tmp/tests/* $FINAL/ 2>/dev/null
[ "${OVERHEAD:-1}" = 0 ] && exit 0  # OVERHEAD=0: tests and the A-B cost only
PLUGIN=1 RUN_TIMEOUT=200 RUN_ARGS="--modes normal,overhead --rounds 24 --overhead-steps 5 --overhead-arms default" \
  bash bench/multigpu/cost_call.sh 2>&1 | tail -8
