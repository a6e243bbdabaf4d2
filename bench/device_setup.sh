# Sourced by the device calls (bench/multigpu/*_call.sh): the environment every NCCL run
# there needs, the carried cp312 wheels (`.whl`) installed into /tmp/site, and the C tracker
# built for the device's Python (its compiler output in $OUT/build.txt).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
gcc -O2 -shared -fPIC -Wall -I"$inc" otel_train/_fastpath.c -o "otel_train/_fastpath$ext" \
  > "$OUT/build.txt" 2>&1 || cat "$OUT/build.txt"
