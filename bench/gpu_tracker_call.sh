#!/bin/bash
# One device call on a one-GPU machine (the `device` tool): the C tracker built for the
# device's Python, its equivalence test, the GPU tests, then step pairs on CUDA (default
# settings, so the C tracker) and on the host's CPU by part (C against Python tracker).
# Everything lands under $OUT. Carry `.whl` (docs/gpu.md: the cp312 wheels otel-train needs).
#   PAIRS (1000; 0 skips the pairs; PAIRS_ARGS more arguments, e.g. --emitter-parts; PAIRS_TIMEOUT
#   330 s), CPU_ROUNDS (6; 0 skips the CPU parts), TEST_TIMEOUT (200 s; TESTS=0 skips
#   the tests), CUDA_ROUNDS (0; N: N rounds of CUDA pairs by part, C against Python tracker),
#   WAKEUP_STEPS (0; N: bench/gil_wakeups.py over N CUDA steps, 2 rounds)
set -u
# the NCCL environment, the carried wheels in /tmp/site, the C tracker built ($OUT/build.txt)
source bench/device_setup.sh
python3 - <<'EOF' | tee "$OUT/env.txt"
import platform, torch, otel_train.tracker as t
print("python", platform.python_version(), "torch", torch.__version__,
      "gpu", torch.cuda.get_device_name(0), "tracker", t.tracker_class().__name__)
EOF
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/env.txt"
if [ "${TESTS:-1}" != 0 ]; then
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/sdk/test_tracker_core.py \
  > "$OUT/tracker-core.txt" 2>&1
echo "tracker core rc=$?"; tail -2 "$OUT/tracker-core.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest tests/gpu -q -p no:cacheprovider -rfEs \
  > "$OUT/pytest-gpu.txt" 2>&1
echo "gpu tests rc=$?"; tail -4 "$OUT/pytest-gpu.txt"
fi
if [ "${PAIRS:-1000}" -gt 0 ]; then
  timeout "${PAIRS_TIMEOUT:-330}" python3 bench/bench_step_pairs.py --device cuda --pairs "${PAIRS:-1000}" \
    ${PAIRS_ARGS:-} --out "$OUT/step-pairs-cuda.md" --json "$OUT/step-pairs-cuda.json" > "$OUT/pairs.log" 2>&1
  echo "pairs rc=$?"; grep -E 'pair ratio, median|bound:|threads here|verdict' "$OUT/step-pairs-cuda.md"
fi
if [ "${CUDA_ROUNDS:-0}" -gt 0 ]; then
  timeout 300 python3 bench/bench_step_pairs.py --device cuda --parts "$CUDA_ROUNDS" \
    --pairs 200 --arms default,python_tracker --out "$OUT/step-pairs-cuda-parts.md" \
    > "$OUT/cuda-parts.log" 2>&1
  echo "cuda parts rc=$?"; grep -E '^\| (default|python_tracker)' "$OUT/step-pairs-cuda-parts.md"
fi
if [ "${WAKEUP_STEPS:-0}" -gt 0 ]; then
  timeout 200 python3 bench/gil_wakeups.py --device cuda --steps "$WAKEUP_STEPS" --rounds 2 \
    --out "$OUT/gil-wakeups-cuda.md" > "$OUT/wakeups.log" 2>&1
  echo "wakeups rc=$?"; grep -E '^\| [0-9]' "$OUT/gil-wakeups-cuda.md"
fi
if [ "${CPU_ROUNDS:-6}" -gt 0 ]; then
  timeout 150 python3 bench/bench_step_pairs.py --device cpu --parts "${CPU_ROUNDS:-6}" \
    --pairs 500 --out "$OUT/step-pairs-cpu-parts.md" > "$OUT/cpu-parts.log" 2>&1
  echo "cpu parts rc=$?"; grep -E '^\| (default|python_tracker|no_)' "$OUT/step-pairs-cpu-parts.md"
fi
ls -la "$OUT"
