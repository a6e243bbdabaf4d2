#!/bin/bash
# One device call: the multi-GPU run (all modes), then the GPU tests; everything under $OUT.
# Expects the NVLS variables, TORCH_NCCL_* and OTEL_TRAIN_STALL_TIMEOUT_S exported already.
NGPU=${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
R=/tmp/mg
rm -rf $R && mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
nvidia-smi topo -m
env | grep -E '^(NCCL|TORCH_|NVSHMEM|OTEL_TRAIN)' | sort
timeout ${RUN_TIMEOUT:-330} torchrun --standalone --nproc-per-node $NGPU bench/multigpu/run.py \
  --out $R $RUN_ARGS
echo "torchrun rc=$?"
(cd $R && tar czf $OUT/mg.tar.gz --exclude='profiles' --exclude='*.pt.trace.json' .)
(cd $R && find . -path '*profiles*' -name '*.json' | tar czf $OUT/prof.tar.gz -T -)
cp $R/fr-dump-rank0.json $OUT/ 2>/dev/null
[ -n "$SKIP_TESTS" ] && { ls -la $OUT; exit 0; }
timeout ${TEST_TIMEOUT:-170} python3 -m pytest tests/gpu -q -p no:cacheprovider -rA \
  > $OUT/pytest.txt 2>&1
echo "pytest rc=$?"
tail -40 $OUT/pytest.txt
ls -la $OUT
