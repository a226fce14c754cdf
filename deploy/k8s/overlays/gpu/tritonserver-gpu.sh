#!/bin/sh
# Entrypoint of the NGC tritonserver on GPU hosts (the Kubernetes gpu overlay and deploy/compose).
#
# - Refuses to start when the GPUs it can see differ from GPUS, the count the repository was built for
#   (`make deploy-repo` = `exporters build --gpus $GPUS`): a model pinned to a missing GPU would fail
#   to load, a spare GPU would sit idle. Without GPUS (compose), it uses every visible GPU.
# - Keeps 20% of each GPU's memory free: --model-load-gpu-limit=<gpu>:0.8 makes Triton refuse a model
#   load that would start above 80% in use (GPU_MEMORY_LOAD_LIMIT overrides the fraction).
# - Drains on SIGTERM: exec makes tritonserver the signalled process; it finishes in-flight requests
#   for up to EXIT_TIMEOUT_SECS before exiting.
# Extra arguments are passed on to tritonserver.
set -eu

visible=$(nvidia-smi --list-gpus | grep -c '^GPU ' || true)
gpus=${GPUS:-$visible}
if [ "$visible" -ne "$gpus" ]; then
    echo "tritonserver-gpu.sh: the repository is built for GPUS=$gpus but this container sees $visible GPU(s)" >&2
    exit 1
fi

set -- --model-repository="${MODEL_REPOSITORY:-/models}" \
    --model-control-mode=none \
    --exit-timeout-secs="${EXIT_TIMEOUT_SECS:-30}" \
    --allow-metrics=true --allow-gpu-metrics=true \
    --metrics-config=summary_latencies=true "$@"
gpu=0
while [ "$gpu" -lt "$gpus" ]; do
    set -- "$@" --model-load-gpu-limit="$gpu:${GPU_MEMORY_LOAD_LIMIT:-0.8}"
    gpu=$((gpu + 1))
done
exec tritonserver "$@"
