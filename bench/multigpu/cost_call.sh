#!/bin/bash
# One device call for issue 15: the cost by arm and thread, a profile of the emitter thread,
# a normal run (checked: every step one trace of every rank, every collective measured) and
# the paired overhead rounds; results under $OUT. Carry .whl (docs/multigpu.md).
#
# PLUGIN=1: the launcher names otel-train's NCCL profiler plugin (NCCL_PROFILER_PLUGIN), and
# the plugin's own C cost per collective is measured first (bench/nccl/plugin_cost.c).
# BASELINE=1 (with PLUGIN=1): afterwards, the cost mode again without the plugin, into
# $OUT/baseline/ (the NCCL threads' CPU with and without it).
set -o pipefail
# at most 8 files come back from the device: everything goes into one archive at the end
FINAL=$OUT; OUT=/tmp/out; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $FINAL/results.tgz -C $OUT . ; cp $OUT/verdict*.md $FINAL/ 2>/dev/null' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ENABLE_TIMING=1 OTEL_TRAIN_STALL_TIMEOUT_S=5
# the flight recorder's ring: torch's default (2000) unless FR_SIZE is given
[ -n "$FR_SIZE" ] && export TORCH_FR_BUFFER_SIZE=$FR_SIZE
export PYTHONUNBUFFERED=1
NGPU=${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "$PLUGIN" ]; then
  cc -O2 -o /tmp/plugin_cost bench/nccl/plugin_cost.c -lpthread -ldl \
    && /tmp/plugin_cost 2 events | tee $OUT/plugin-cost.json \
    && /tmp/plugin_cost 2 > $OUT/plugin-cost-kernel.json
  export NCCL_PROFILER_PLUGIN=$(python3 -m otel_train.cli nccl-plugin) || exit 1
  echo "NCCL_PROFILER_PLUGIN=$NCCL_PROFILER_PLUGIN"
fi
if [ -n "$FIRST_TEST" ]; then  # a quick check that stops the call early if it fails
  timeout 240 python3 -m pytest $FIRST_TEST -q -p no:cacheprovider -rA -x \
    > $OUT/pytest-first.txt 2>&1; rc=$?; tail -25 $OUT/pytest-first.txt
  [ $rc -eq 0 ] || exit 1
fi
R=/tmp/mg; rm -rf $R; mkdir -p $R
timeout ${RUN_TIMEOUT:-480} torchrun --standalone --nproc-per-node $NGPU bench/multigpu/run.py \
  --out $R ${RUN_ARGS:---modes cost,emitter_profile,normal,overhead} 2>&1 | grep -v '^{' \
  | tee $OUT/run.log | grep -v '^\[rank' | cut -c1-400 | tail -40
cp $R/result-rank*.json $R/emitter-profile-rank*.txt $R/emitter-parts-rank*.txt $OUT/ 2>/dev/null
[ -f $OUT/plugin-cost.json ] && cp $OUT/plugin-cost.json $R/
[ -d $R/normal ] && python3 bench/multigpu/check.py $R > $OUT/check.json 2>&1
python3 bench/multigpu/verdict.py $R --out $OUT/verdict.md | tail -6
if [ -n "$GPU_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-200} env -u NCCL_PROFILER_PLUGIN python3 -m pytest ${GPU_TESTS_ARGS:-tests/gpu} -q -p no:cacheprovider -rA \
    > $OUT/pytest-gpu.txt 2>&1
  echo "pytest rc=$?"; tail -15 $OUT/pytest-gpu.txt
fi
if [ -n "$BASELINE" ]; then
  unset NCCL_PROFILER_PLUGIN
  mkdir -p $OUT/baseline; R=/tmp/mg0; rm -rf $R; mkdir -p $R
  timeout ${BASELINE_TIMEOUT:-200} torchrun --standalone --nproc-per-node $NGPU \
    bench/multigpu/run.py --out $R ${BASELINE_ARGS:---modes cost} 2>&1 | grep -v '^{' \
    > $OUT/baseline/run.log
  cp $R/result-rank*.json $OUT/baseline/ 2>/dev/null
  python3 bench/multigpu/verdict.py $R --out $OUT/baseline/verdict.md | tail -3
  python3 bench/multigpu/verdict.py /tmp/mg --baseline $R --out $OUT/verdict-with-baseline.md | tail -6
fi
ls $OUT
