#!/usr/bin/env bash
# The prepared GPU check (vagen/gpu_check.py): on a machine with one NVIDIA GPU, its own torch and no
# network, two TRICO iterations of configs/sokoban_qwen2_5_vl_3b_trico.yaml on a random-init
# Qwen2.5-VL-3B (hf engine, DeepSpeed ZeRO-3, bf16); prints rollout tokens/s, update time, peak memory and
# MFU. About 5-8 minutes on an H100 (not yet run: no GPU so far).
#
# Nothing comes from the network. The packages beyond the machine's torch travel with the tree as wheels
# in shared/wheels/ (or $VAGEN_WHEELS), which `make gpu-wheels` (= this script with --prepare-wheels)
# downloads on a machine with network: the exact versions .venv holds of vagen's runtime packages and
# their dependencies (transformers, tokenizers, deepspeed, peft, gymnasium, ...; about 55 wheels,
# ~150 MB, not committed), for CPython $GPU_PYTHON (default 3.11) on manylinux x86-64, WITHOUT torch,
# torchvision, CUDA libraries, triton, vLLM or wandb: the GPU machine's own torch (and its torchvision,
# which Qwen-VL processors import) is used through a --system-site-packages virtual environment.
#
#   bash scripts/gpu_check.sh                    # the GPU form (<= 8 minutes)
#   bash scripts/gpu_check.sh --cpu              # the CPU form (tiny VLM, float32): what `make test` runs
#   bash scripts/gpu_check.sh --prepare-wheels   # here, with network: fill shared/wheels/
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--cpu" ]]; then
  exec env DS_ACCELERATOR=cpu WANDB_MODE=offline TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD" \
    .venv/bin/python -m vagen.gpu_check "$@"
fi
WHEELS="${VAGEN_WHEELS:-shared/wheels}"
if [[ "${1:-}" == "--prepare-wheels" ]]; then
  mkdir -p "$WHEELS"
  .venv/bin/python - > "$WHEELS/requirements.txt" <<'PY'
"""The runtime packages' dependency closure, as installed in .venv, without torch and GPU-specific ones."""
import re
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement

skip = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|vllm.*|wandb)$")
todo = ["transformers", "tokenizers", "deepspeed", "peft", "gymnasium", "pillow", "numpy", "omegaconf",
        "imageio", "tqdm", "safetensors", "matplotlib", "pyyaml"]
seen = {}
while todo:
    name = todo.pop()
    key = name.lower().replace("_", "-")
    if key in seen or skip.match(key):
        continue
    try:
        seen[key] = distribution(name).version
    except PackageNotFoundError:
        continue
    todo += [r.name for r in map(Requirement, distribution(name).requires or [])
             if r.marker is None or r.marker.evaluate({"extra": ""})]
print("\n".join(f"{name}=={version}" for name, version in sorted(seen.items())))
PY
  # DeepSpeed is published as a source archive only: build its (pure-Python, ops compiled at run time)
  # wheel here against .venv's torch; every other package as a binary wheel for the GPU machine's Python
  grep -v '^deepspeed==' "$WHEELS/requirements.txt" > "$WHEELS/binary.txt"
  .venv/bin/pip download --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.11}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$WHEELS" -r "$WHEELS/binary.txt"
  DS_BUILD_OPS=0 .venv/bin/pip wheel --no-deps --no-build-isolation -w "$WHEELS" \
    "$(grep '^deepspeed==' "$WHEELS/requirements.txt")"
  exit 0
fi
VENV=.gpu-venv
if [[ ! -x "$VENV/bin/python" ]]; then
  [[ -f "$WHEELS/requirements.txt" ]] || { echo "gpu_check: no $WHEELS/requirements.txt (make gpu-wheels)"; exit 1; }
  python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install --quiet --no-index --find-links "$WHEELS" -r "$WHEELS/requirements.txt"
fi
"$VENV/bin/python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name(0))"
export WANDB_MODE=offline TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONPATH="$PWD"
exec timeout 480 "$VENV/bin/python" -m vagen.gpu_check "$@"
