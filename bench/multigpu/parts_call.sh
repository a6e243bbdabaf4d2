#!/bin/bash
# One device call: the plugin's GPU test, then the cost and the emitter's CPU by part in
# separate processes: flight recorder (a1), the plugin (b), the plugin polling every 50 ms
# (b50) (bench/multigpu/plugin_aba.sh). Results: one archive and the summaries in $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 120 python3 -m pytest tests/gpu/test_nccl_profiler_plugin.py -q -p no:cacheprovider -rA \
  > $OUT/pytest-plugin.txt 2>&1; echo "plugin test rc=$?"; tail -3 $OUT/pytest-plugin.txt
RUNS=${RUNS:-"a1 b b50"} RUN_TIMEOUT=${RUN_TIMEOUT:-140} \
  RUN_ARGS=${RUN_ARGS:-"--modes cost,emitter_parts --cost-arms default --cost-repeats 2"} \
  bash bench/multigpu/plugin_aba.sh | tail -30
for r in ${RUNS:-a1 b b50}; do echo "== $r"; head -14 /tmp/out/$r/emitter-parts-rank0.txt; done
