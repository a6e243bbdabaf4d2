#!/bin/bash
# Issue 16 item 7: otel-train's overlap against HolisticTraceAnalysis on each rank's own
# profiler window of the compiled FSDP2 model on the GPUs of one host. Carry .whl and .whl-hta
# (HolisticTraceAnalysis 0.5.0 and its dependencies, cp312 wheels: pip download, see
# docs/gpu.md). Results: the rank files and a summary in $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
python3 -c "import numpy" 2>/dev/null && rm -f .whl-hta/numpy-*.whl  # keep torch's numpy
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/hta .whl-hta/*.whl || exit 1
export PYTHONPATH=/tmp/site:/tmp/hta:$PWD
python3 -c "from hta.trace_analysis import TraceAnalysis; import hta; print('hta', hta.__file__)" || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ENABLE_TIMING=1 PYTHONUNBUFFERED=1
NGPU=${NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
R=/tmp/hta-run; rm -rf $R; mkdir -p $R
timeout ${RUN_TIMEOUT:-300} torchrun --standalone --nproc-per-node $NGPU bench/multigpu/run.py \
  --out $R --modes profile 2>&1 | grep -v '^{' | tail -5
cp $R/result-rank*.json $OUT/
python3 - $R <<'PY' | tee $OUT/hta-overlap.md
import json, sys
from pathlib import Path
print("| rank | profiler trace | otel-train overlap | HTA comp_comm_overlap_pctg | comm kernels |")
print("| --- | --- | --- | --- | --- |")
for f in sorted(Path(sys.argv[1]).glob("result-rank*.json")):
    d = json.loads(f.read_text())
    p = d["modes"]["profile"]
    ours = p.get("otel_overlap_unrounded")
    print(f"| {d['rank']} | {Path(p.get('trace', '?')).name} | "
          f"{'n/a' if ours is None else f'{100 * ours:.2f}%'} | "
          f"{p.get('hta_overlap_pct', p.get('hta_error'))} | {p.get('comm_kernels')} |")
PY
