#!/bin/bash
# One device call for issue 15: the cost by arm and thread, a profile of the emitter thread,
# a normal run (checked: every step one trace of every rank, every collective measured) and
# the paired overhead rounds; results under $OUT. Carry .whl (docs/multigpu.md).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ENABLE_TIMING=1 OTEL_TRAIN_STALL_TIMEOUT_S=5
# the flight recorder's ring: torch's default (2000) unless FR_SIZE is given
[ -n "$FR_SIZE" ] && export TORCH_FR_BUFFER_SIZE=$FR_SIZE
export PYTHONUNBUFFERED=1
NGPU=${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
R=/tmp/mg; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${RUN_TIMEOUT:-480} torchrun --standalone --nproc-per-node $NGPU bench/multigpu/run.py \
  --out $R ${RUN_ARGS:---modes cost,emitter_profile,normal,overhead} 2>&1 | grep -v '^{' \
  | tee $OUT/run.log | grep -v '^\[rank' | cut -c1-400 | tail -40
cp $R/result-rank*.json $R/emitter-profile-rank*.txt $OUT/ 2>/dev/null
[ -d $R/normal ] && python3 bench/multigpu/check.py $R > $OUT/check.json 2>&1
python3 bench/multigpu/verdict.py $R --out $OUT/verdict.md | tail -4
ls $OUT
if [ -n "$GPU_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/gpu -q -p no:cacheprovider -rA \
    > $OUT/pytest-gpu.txt 2>&1
  echo "pytest rc=$?"; tail -15 $OUT/pytest-gpu.txt
fi
