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


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test; yields the env vars that give a subprocess the same.

    Bitwise-reproducible CPU math (with several threads MKL may change its thread count, and so the
    order of float sums, under load; the untrained tiny model samples from near-uniform distributions,
    where one ulp can flip a token), and far faster on a busy 2-core machine: the tiny model is
    overhead-bound, a second thread only contends."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    torch.set_num_threads(threads)
