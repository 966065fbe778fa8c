"""The tiny models the repo ships: built deterministically from `assets/tiny/` and a seed, then cached.

`tiny-vlm` is a Qwen2.5-VL (0.82M parameters: text hidden 128 x 2 layers, vision hidden 64 x 2
blocks), `tiny-qwen3-vl` a Qwen3-VL of the same sizes (0.94M: learned vision position embeddings, one
DeepStack layer, interleaved M-RoPE), `tiny-llava` a LLaVA (0.80M: the same Qwen2 text tower under a
2-layer CLIP tower of hidden 64, 112 px images in 28 px patches, 16 image tokens each; its processor uses
`<|image_pad|>` as LLaVA's image token) and `tiny-text` a Qwen2 with the same text tower, all with the
project's byte-level BPE tokenizer (scripts/train_tokenizer.py) and chat template
(assets/tiny/chat_template.jinja: ChatML, the markup all four use). The Qwen image processors map
one merged visual token to one grid cell (Qwen2.5-VL: 28 px, patch 14 x merge 2; Qwen3-VL: 32 px, patch
16 x merge 2; envs render at that cell size, vagen.rollout.manager.fit_env_to_model) and leave images of
2 to 10 tokens a side unresized: FrozenLake 4x4 -> 16 tokens, Sokoban 6x6 -> 36 tokens (the LLaVA's
fixed 112 px input takes a 4x4 board of 28 px cells unresized and resizes larger ones). The size class
learned visual FrozenLake fastest per CPU minute (notes/tiny-vlm-frozenlake-sft.md). Weights are not
committed; the builder writes a normal `save_pretrained` directory, loaded back through the same Auto*
path real checkpoints use.

Cache: `$VAGEN_CACHE/models/<name>-s<seed>-<fingerprint>` (default `VAGEN_CACHE=<repo>/.cache`);
the fingerprint hashes the asset files and the torch/transformers versions, so editing an asset
rebuilds. Builds are atomic (write to a temporary directory, then rename), so concurrent processes
never see a half-written model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "assets" / "tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TINY_MODELS = {
    # name: (model config, Auto class, {file written beside the tokenizer: its asset})
    "tiny-vlm": (
        "vlm_config.json",
        AutoModelForImageTextToText,
        {"processor_config.json": "processor_config.json"},
    ),
    "tiny-qwen3-vl": (
        "qwen3_vl_config.json",
        AutoModelForImageTextToText,
        {"processor_config.json": "qwen3_vl_processor_config.json"},
    ),
    "tiny-llava": (
        "llava_config.json",
        AutoModelForImageTextToText,
        {"processor_config.json": "llava_processor_config.json"},
    ),
    "tiny-text": ("text_config.json", AutoModelForCausalLM, {}),
}


def cache_root() -> Path:
    return Path(os.environ.get("VAGEN_CACHE", REPO / ".cache"))


def build_tiny_model(name: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write the tiny model `name` with weights drawn from `seed` to `out_dir` (same seed -> same bytes)."""
    config_file, auto_class, extra_files = TINY_MODELS[name]
    config_dict = json.loads((ASSETS / config_file).read_text())
    config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    torch.manual_seed(seed)
    model = auto_class.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = config_dict.get("text_config", config_dict)["eos_token_id"]
    model.generation_config.pad_token_id = config_dict.get("text_config", config_dict)["pad_token_id"]
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    for file in TOKENIZER_FILES:
        shutil.copyfile(ASSETS / file, out_dir / file)
    for file, asset in extra_files.items():
        shutil.copyfile(ASSETS / asset, out_dir / file)
    return out_dir


def _fingerprint(name: str) -> str:
    config_file, _, extra_files = TINY_MODELS[name]
    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for file in (config_file, *TOKENIZER_FILES, *extra_files.values()):
        digest.update((ASSETS / file).read_bytes())
    return digest.hexdigest()[:12]


def tiny_model_path(name: str, seed: int = 0) -> Path:
    """The cached directory of tiny model `name`, built on first use."""
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {sorted(TINY_MODELS)}")
    target = cache_root() / "models" / f"{name}-s{seed}-{_fingerprint(name)}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build_tiny_model(name, staging, seed)
        os.rename(staging, target)  # atomic; fails if another process finished first
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model_path(name_or_path: str | Path, seed: int = 0) -> Path:
    """The cached tiny model for a TINY_MODELS name; otherwise a local directory that must exist."""
    if str(name_or_path) in TINY_MODELS:
        return tiny_model_path(str(name_or_path), seed)
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model path {str(path)!r} is not a local directory (VAGEN never downloads from a hub); "
            f"pass a directory in save_pretrained format or one of {sorted(TINY_MODELS)}"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no config.json; is it a save_pretrained directory?"
        )
    return path
