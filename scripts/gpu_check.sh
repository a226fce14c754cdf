#!/usr/bin/env bash
# On a GPU host: the GPU tests (KIND_GPU placement, CUDA/TensorRT providers, parity with torch) and a
# short raw-onnxruntime comparison of CPU vs CUDA, with a table last. Run with `make gpu-check`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check here." >&2
  exit 0
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
$PY -c "import onnxruntime as o; print('onnxruntime providers:', o.get_available_providers())"
$PY -m pytest -q -m gpu tests/gpu -rs
$PY -m exporters build --repository .run/gpu_repository --models recommender,image_classifier >/dev/null
$PY - <<'PYEOF'
import time
import numpy as np
import onnxruntime as ort
from exporters.resolve import load_spec
from exporters.inputs import draw_inputs
from exporters.sources.load import build_torch_model

rows = []
spec = load_spec("models.yaml")
for name in ("recommender", "image_classifier"):
    model_spec = spec.model(name)
    model = build_torch_model(model_spec)
    for provider in ("CPUExecutionProvider", "CUDAExecutionProvider"):
        session = ort.InferenceSession(f".run/gpu_repository/{name}/1/model.onnx", providers=[provider])
        for batch in (1, 32):
            feeds = {t.name: a for t, a in zip(model_spec.inputs, draw_inputs(model_spec, batch, 0, model))}
            for _ in range(10):
                session.run(None, feeds)
            start, n = time.perf_counter(), 100
            for _ in range(n):
                session.run(None, feeds)
            per_call = (time.perf_counter() - start) / n
            rows.append((name, provider.replace("ExecutionProvider", ""), batch, per_call * 1e3, batch / per_call))
print(f"{'model':18} {'provider':8} {'batch':>5} {'ms/call':>9} {'inf/s':>10}")
for row in rows:
    print(f"{row[0]:18} {row[1]:8} {row[2]:5d} {row[3]:9.3f} {row[4]:10.0f}")
PYEOF
# The planner on the GPUs found here (instances per GPU, fp32/fp16/int8, placement, headroom), and the memory
# one instance holds on the CUDA provider's arena (what the planner's headroom counts on a GPU).
$PY - <<'PYEOF'
from pathlib import Path
from exporters.memory import measured_instance_memory
from exporters.resolve import load_spec
spec = load_spec("models.yaml").model("recommender")
path = Path(".run/gpu_repository/recommender/1/model.onnx")
cuda = measured_instance_memory(spec, path, provider="cuda")
cpu = measured_instance_memory(spec, path)
print(f"recommender, one instance at batch {spec.max_batch_size}: CUDA {cuda / 2**20:.1f} MiB, CPU {cpu / 2**20:.1f} MiB")
PYEOF
$PY -m perf plan --model recommender --p99-ms 10 --reports .run/gpu_plan
