"""Shared test settings: offline logging, CPU DeepSpeed, in-process vLLM, few threads."""

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# Tiny model directories (vagen.models.tiny), built once per machine into $VAGEN_CACHE/models
# (default <repo>/.cache/models) and reused by every test session.
@pytest.fixture(scope="session")
def tiny_vlm_path():
    from vagen.models.tiny import tiny_model_path

    return tiny_model_path("tiny-vlm")


@pytest.fixture(scope="session")
def tiny_text_path():
    from vagen.models.tiny import tiny_model_path

    return tiny_model_path("tiny-text")
