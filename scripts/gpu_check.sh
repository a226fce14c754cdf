#!/usr/bin/env bash
# The GPU check (docs/GPU.md), one command on the lent GPU machine as it comes: its python3, the wheels
# carried in .gpu-carry (`make gpu-carry` here) installed into a temporary folder, then
# `python -m gpucheck run`, which builds the repository there, starts tritonserver on KIND_GPU and writes
# its report, figures, plots and log to $OUT. `make gpu-rehearsal` runs this same script on the CPU.
#   PYTHON     the interpreter (default python3: the machine's)
#   OUT        where the files go (default reports/gpu-check); the device tool sets it
#   GPU_CARRY  the carried folder (default .gpu-carry)
#   GRID       gpu (default) or rehearsal
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-reports/gpu-check}
CARRY=${GPU_CARRY:-.gpu-carry}
if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
  echo "gpu-check: no wheels in $CARRY/wheels: run \`make gpu-carry\` where PyPI is reachable and carry $CARRY" >&2
  exit 2
fi
SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpucheck-site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$OUT"
echo "gpu-check: installing $(ls "$CARRY"/wheels/*.whl | wc -l) carried wheels into $SITE"
"$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
  --target "$SITE" "$CARRY"/wheels/*.whl
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$PY" -m gpucheck run --out "$OUT" --grid "${GRID:-gpu}" --carried "$CARRY"
