"""Every model family through the same path: build, both engines, scoring parity, the value head, two RL
steps and an exact resume. Parametrized by family id: `pytest -k qwen3` runs Qwen3-VL only."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_trainer import comparable, tiny_overrides  # a sibling test module

from vagen.config import EnvConfig, RolloutConfig, load_config
from vagen.distributed import init_distributed
from vagen.metrics import read_metrics
from vagen.models.adapters import adapter_for
from vagen.models.loading import ValueModel, load_policy
from vagen.models.scoring import token_logprobs, token_values
from vagen.models.tiny import tiny_model_path
from vagen.models.vision import encode_images
from vagen.rollout.assembly import ChatCodec, EpisodeAssembler
from vagen.rollout.engines import Prompt, SamplingParams, make_engine
from vagen.rollout.manager import fit_env_to_model, make_language_env
from vagen.trainer import train

REPO = Path(__file__).resolve().parents[1]
# family id -> (tiny model, HF model_type, pixels one visual token covers)
FAMILIES = {
    "qwen2_5_vl": ("tiny-vlm", "qwen2_5_vl", 28),
    "qwen3_vl": ("tiny-qwen3-vl", "qwen3_vl", 32),
    "llava": ("tiny-llava", "llava", 28),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(family id, model, processor) of each family's tiny model."""
    model, processor = load_policy(tiny_model_path(FAMILIES[request.param][0]))
    return request.param, model, processor


def two_turn_prompt(family_id: str, processor) -> tuple[Prompt, EnvConfig]:
    """A FrozenLake 4x4 context of two turns (one reply between), rendered at the model's cell size."""
    env_cfg = EnvConfig(env_kwargs={"size": 4})
    fit_env_to_model(env_cfg, FAMILIES[family_id][0])
    env = make_language_env(env_cfg)
    assembler = EpisodeAssembler(ChatCodec(processor), env.system_prompt, None, False)
    observation, _ = env.reset(seed=3)
    assembler.commit(assembler.prepare(observation.text, observation.images))
    reply = processor.tokenizer.encode("<think>x</think><answer>Left</answer><|im_end|>")
    assembler.add_reply(reply, [0.0] * len(reply), stopped=True)
    observation, *_ = env.step("<answer>Left</answer>")
    token_ids, images = assembler.commit(assembler.prepare(observation.text, observation.images))
    return Prompt(token_ids, images), env_cfg


def test_tiny_model_builds_and_envs_render_one_cell_per_token(family):
    family_id, model, processor = family
    _, model_type, pixels = FAMILIES[family_id]
    adapter = adapter_for(model.config)
    assert model.config.model_type == model_type and adapter.merged_token_pixels(model.config) == pixels
    assert 0.7e6 < sum(p.numel() for p in model.parameters()) < 1.1e6
    lora_modules = [n for n, _ in model.named_modules() if re.fullmatch(adapter.lora_targets, n)]
    assert len(lora_modules) == 2 * 7 and all(".language_model." in n for n in lora_modules)
    prompt, env_cfg = two_turn_prompt(family_id, processor)
    assert env_cfg.env_kwargs.get("cell_size", 28) == pixels  # set only where the env's 28 px differs
    assert prompt.images[0].size == (4 * pixels, 4 * pixels)
    vision = encode_images(processor, adapter, prompt.images)
    assert adapter.image_token_counts(model.config, vision).tolist() == [16, 16]  # one token per cell
    image_token = adapter.image_token_id(model.config)
    assert prompt.token_ids.count(image_token) == 32


@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_engines_sample_what_scoring_scores(family, engine_name):
    """The engine's log-probs of its own samples equal the trainer's scoring of them."""
    family_id, model, processor = family
    if engine_name == "vllm":
        pytest.importorskip("vllm")
    init_distributed()  # the trainer's group exists first, as in a run: the engine leaves it in place
    engine = make_engine(engine_name, model, processor, RolloutConfig(max_context_tokens=1024))
    prompt, _ = two_turn_prompt(family_id, processor)
    params = SamplingParams(temperature=0.8, max_new_tokens=12, seed=7)
    [generation] = engine.generate([prompt], params)
    assert len(generation.token_ids) == 12
    ids = torch.tensor([prompt.token_ids + generation.token_ids])
    vision = encode_images(processor, adapter_for(model.config), prompt.images)
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids), vision, 1, False, temperature=0.8)
    atol = 1e-5 if engine_name == "hf" else 1e-3
    torch.testing.assert_close(
        torch.tensor(generation.logprobs), logp[0, len(prompt.token_ids) :], atol=atol, rtol=0
    )


def test_value_head_reads_the_backbone(family, tmp_path):
    family_id, model, processor = family
    critic = ValueModel.from_pretrained(tiny_model_path(FAMILIES[family_id][0]))
    prompt, _ = two_turn_prompt(family_id, processor)
    ids = torch.tensor([prompt.token_ids])
    vision = encode_images(processor, adapter_for(model.config), prompt.images)
    with torch.no_grad():
        assert (token_values(critic, ids, torch.ones_like(ids), vision, 1) == 0).all()  # zero head
        torch.nn.init.normal_(critic.value_head.weight, std=0.1)
        values = token_values(critic, ids, torch.ones_like(ids), vision, 1)
        assert values[0, 1:].abs().min() > 0
        critic.save_pretrained(tmp_path / "critic")
        reloaded = ValueModel.from_pretrained(tmp_path / "critic")
        torch.testing.assert_close(token_values(reloaded, ids, torch.ones_like(ids), vision, 1), values)


def tiny_run(run_dir: Path, model: str, **extra) -> list[str]:
    """test_trainer's two tiny RL steps (bilevel GAE, model critic) with `model`, checkpointing each step."""
    return tiny_overrides(
        run_dir, **{"model.path": model, "trainer.save_every": 1, "trainer.val_every": 2, **extra}
    )


@pytest.mark.slow
@pytest.mark.parametrize("family_id", sorted(FAMILIES))
def test_two_rl_steps_then_exact_resume(family_id, tmp_path, monkeypatch, one_torch_thread):
    """Two steps straight == one step, then a fresh process state resumed from its checkpoint."""
    monkeypatch.chdir(REPO)
    model = FAMILIES[family_id][0]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(load_config(REPO / "configs/frozenlake_tiny.yaml", tiny_run(straight, model)))
    train(
        load_config(REPO / "configs/frozenlake_tiny.yaml", tiny_run(resumed, model, **{"trainer.steps": 1}))
    )
    train(
        load_config(
            REPO / "configs/frozenlake_tiny.yaml", tiny_run(resumed, model, **{"trainer.resume": "auto"})
        )
    )
    lines = {run: read_metrics(run / "metrics.jsonl") for run in (straight, resumed)}
    assert [m["step"] for m in lines[straight]] == [0, 1, 2]
    assert all(np.isfinite(v) for m in lines[straight] for v in m.values())
    assert comparable(lines[resumed][-1]) == comparable(lines[straight][-1])
    final = "checkpoints/step_000002"
    weights = [load_file(run / final / "actor" / "model.safetensors") for run in (straight, resumed)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    config = json.loads((straight / final / "actor" / "config.json").read_text())
    assert config["model_type"] == FAMILIES[family_id][1]


def test_unknown_vision_family_and_explicit_cell_size():
    from transformers import AutoConfig

    with pytest.raises(ValueError, match="no adapter for vision-language model_type 'paligemma'"):
        adapter_for(AutoConfig.for_model("paligemma"))
    assert adapter_for(AutoConfig.for_model("qwen2")).merged_token_pixels(None) is None  # text-only
    env_cfg = EnvConfig(env_kwargs={"size": 4, "cell_size": 20})
    fit_env_to_model(env_cfg, "tiny-qwen3-vl")
    assert env_cfg.env_kwargs["cell_size"] == 20  # a configured size is kept
