#!/bin/sh
# The launcher's context for every rank of a training job, then exec the launcher (torchrun).
#
#   sh /etc/otel-train/launcher-context.sh torchrun ... /workspace/train.py
#
# Reads (the pod's env, from the downward API):
#   LAUNCHER_JOB_ID       the job's identity: the same in every pod of one job, different for
#                         every job (an indexed Job: its uid; a PyTorchJob: namespace.name)
#   LAUNCHER_TRACEPARENT  the submitter's own W3C span context, when whatever submitted the job
#                         (a pipeline step, a CI job) stamped it on the pod template as the
#                         annotation otel-train.io/traceparent; empty otherwise
# Exports, before exec (torchrun passes its environment to every rank it starts):
#   TRACEPARENT   the submitter's context, else one derived from the job id alone (sha256: trace
#                 id, span id, sampled), so every rank of every pod parents its training.run span
#                 to the same launcher span without talking to the others
#   PET_RDZV_ID   torchrun's --rdzv-id (unless already set): torchrun hands it to every rank as
#                 TORCHELASTIC_RUN_ID, which otel-train takes as the run id (no broadcast)
# Needs a POSIX sh and sha256sum (coreutils or busybox) in the image.
set -eu
: "${LAUNCHER_JOB_ID:?LAUNCHER_JOB_ID (the job id, from the downward API) is not set}"
if [ -n "${LAUNCHER_TRACEPARENT:-}" ]; then
    TRACEPARENT=$LAUNCHER_TRACEPARENT
else
    digest=$(printf '%s' "$LAUNCHER_JOB_ID" | sha256sum | cut -c1-48)
    TRACEPARENT="00-$(printf '%s' "$digest" | cut -c1-32)-$(printf '%s' "$digest" | cut -c33-48)-01"
fi
PET_RDZV_ID=${PET_RDZV_ID:-$LAUNCHER_JOB_ID}
export TRACEPARENT PET_RDZV_ID
exec "$@"
