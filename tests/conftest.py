"""Shared test settings: offline logging, CPU DeepSpeed, in-process vLLM, few threads."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
