"""The rollout manager on the real environments: seeds, episode ends, one engine call per turn, rewards,
contexts, reproducibility and text-only mode with the tiny models."""

import numpy as np
import pytest
import torch

from envs_visual.sokoban import SokobanEnv
from vagen.config import EnvConfig, RolloutConfig
from vagen.models.loading import load_policy, load_processor, model_inputs
from vagen.models.scoring import token_logprobs
from vagen.rollout.engines.base import Generation
from vagen.rollout.engines.hf import HFEngine
from vagen.rollout.evaluate import evaluate
from vagen.rollout.manager import RolloutManager
from vagen.rollout.seeds import VAL_SEED_START, SeedSchedule

GOOD = "<think>go</think><answer>Down, Right</answer>"
GROUNDED = (
    "<think><observation>The goal is below the player and to the right of the player.</observation>"
    "<reasoning>go</reasoning></think><answer>Down</answer>"
)


class ScriptedEngine:
    """A GenerationEngine answering each prompt with the next scripted reply (+ <|im_end|>)."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.calls = tokenizer, replies, []

    def generate(self, prompts, params):
        self.calls.append(prompts)
        out = []
        for i in range(len(prompts)):
            reply = self.replies[(len(self.calls) - 1 + i) % len(self.replies)]
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + list(params.stop_token_ids)
            out.append(Generation(ids, [-0.25] * len(ids), "stop"))
        return out

    def sync_weights(self, model):
        pass


@pytest.fixture(scope="module")
def processor(tiny_vlm_path):
    return load_processor(tiny_vlm_path)


def manager(processor, replies, env_id="envs_visual/FrozenLake-v0", env_kwargs=None, **rollout):
    env_cfg = EnvConfig(env_id=env_id, env_kwargs=env_kwargs or {}, prompt_format="free_think")
    cfg = RolloutConfig(**{"num_groups": 2, "group_size": 3, "max_turns": 3, **rollout})
    return RolloutManager(env_cfg, cfg, ScriptedEngine(processor.tokenizer, replies), processor)


def test_groups_share_levels_and_members_get_own_dynamics(processor):
    m = manager(processor, [GOOD], env_kwargs={"is_slippery": True}, max_turns=1)
    batch = m.train_batch()
    episodes = batch.episodes
    first = [ep.turns[0].frame for ep in episodes]
    for g in range(2):
        members = [i for i, ep in enumerate(episodes) if ep.group == g]
        assert all(np.array_equal(first[members[0]], first[i]) for i in members)  # same initial state
        assert len({episodes[i].turns[0].state for i in members}) == 1  # and the same state key
        assert len({episodes[i].dynamics_seed for i in members}) == 3  # own slip RNG per member
    assert not np.array_equal(first[0], first[3])  # groups get different levels
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    # the training counter advanced (past seeds whose layout is held out for validation)
    assert m.train_batch().episodes[0].level_seed > episodes[-1].level_seed


def test_train_and_validation_seeds_never_overlap():
    seeds = SeedSchedule(base_seed=0, train_start=0, val_start=50)
    train = {s.level for _ in range(10) for s in seeds.next_train(5, 2)}
    val = {s.level for s in seeds.validation(20, 2)}
    assert train == set(range(50)) and not train & val
    with pytest.raises(RuntimeError, match="exhausted"):
        seeds.next_train(1, 2)
    assert [s.level for s in seeds.validation(2, 1)] == [50, 51]  # validation levels are fixed
    with pytest.raises(ValueError):
        SeedSchedule(0, train_start=10, val_start=10)


def test_one_engine_call_per_turn_and_finished_episodes_stop(processor):
    # FrozenLake 4x4, actions Down, Right from the start: some levels end (hole / goal) before 3 turns.
    m = manager(processor, [GOOD, "<think>x</think><answer>Left</answer>", "no tags"], max_turns=3)
    batch = m.train_batch()
    calls = m.engine.calls
    live_per_turn = [sum(len(ep.turns) > t for ep in batch.episodes) for t in range(3)]
    assert [len(c) for c in calls] == [n for n in live_per_turn if n] and live_per_turn[2] < 6
    for ep in batch.episodes:
        assert ep.end_reason in {"success", "failure", "max_turns"}
        assert len(ep.turns) == 3 if ep.end_reason == "max_turns" else ep.end_reason in {"success", "failure"}
    # Each turn's reward sits at its turn end; the row's rewards sum to the episode return.
    for row in range(len(batch)):
        assert batch.token_rewards[row].sum().item() == pytest.approx(
            batch.episode_returns[row].item(), abs=1e-5
        )
        assert batch.turn_end[row].sum() == len(batch.episodes[row].turns)
    assert torch.equal(batch.turn_end & ~batch.adv_mask, torch.zeros_like(batch.turn_end))
    no_format = [t for ep in batch.episodes for t in ep.turns if t.reply == "no tags"]
    assert no_format and all(not t.format_ok and t.reward == 0.0 and not t.actions for t in no_format)


def test_action_and_context_budgets_end_episodes_cleanly(processor):
    m = manager(processor, ["<think>a</think><answer>Left, Left</answer>"], max_actions_per_episode=3)
    batch = m.train_batch()
    assert all(ep.num_actions == 3 and ep.end_reason == "action_budget" for ep in batch.episodes)
    assert [len(t.actions) for t in batch.episodes[0].turns] == [2, 1]  # the budget caps the last turn
    first_prompt = len(m.engine.calls[0][0].token_ids)
    m = manager(
        processor,
        [GOOD, "<think>b</think><answer>Up</answer>"],
        max_context_tokens=first_prompt + 40,
        max_new_tokens=20,
    )
    batch = m.train_batch()
    assert {ep.end_reason for ep in batch.episodes} <= {"context_budget", "failure", "success"}
    assert any(ep.end_reason == "context_budget" for ep in batch.episodes)
    assert batch.attention_mask.sum(1).max() <= first_prompt + 40
    with pytest.raises(ValueError, match="max_context_tokens"):
        manager(processor, [GOOD], max_context_tokens=50).train_batch()


def test_window_rows_are_the_contexts_the_engine_saw(processor):
    replies = ["<think>a</think><answer>Up</answer>", "<think>b</think><answer>Left</answer>"]
    m = manager(processor, replies, env_id="envs_visual/Sokoban-v0", window=1, max_turns=4, num_groups=1)
    batch = m.train_batch()
    assert len(batch) > len(batch.episodes)  # window dropped turns: extra segments
    rows = {}
    for r in range(len(batch)):
        rows.setdefault(int(batch.episode_ids[r]), []).append(
            batch.input_ids[r][batch.attention_mask[r].bool()]
        )
    for call in m.engine.calls:
        for prompt in call:
            ids = torch.tensor(prompt.token_ids)
            assert any(
                len(row) > len(ids) and torch.equal(row[: len(ids)], ids) for e in rows for row in rows[e]
            )
    # Every row's images are the ones its pads stand for; select() keeps them with their rows.
    picked = batch.select([len(batch) - 1, 0])
    assert picked.images_per_row.tolist() == [batch.images_per_row[-1].item(), batch.images_per_row[0].item()]
    pads = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (picked.input_ids == pads).sum() == picked.vision.patch_counts().sum() // 4  # 2x2 patches per pad
    assert picked.episode_ids.tolist() == [0, 1] and len(picked.episodes) == 2


def test_reasoning_reward_added_to_turn_reward(processor):
    env_cfg = EnvConfig(prompt_format="grounding", grounding_reward_weight=1.0, format_reward=0.5)
    engine = ScriptedEngine(processor.tokenizer, [GROUNDED])
    m = RolloutManager(env_cfg, RolloutConfig(num_groups=1, group_size=1, max_turns=1), engine, processor)
    turn = m.train_batch().episodes[0].turns[0]
    assert turn.grounding is not None and turn.reward == pytest.approx(turn.env_reward + turn.grounding)


@pytest.fixture(scope="module")
def tiny_text(tiny_text_path):
    return load_policy(tiny_text_path)


def test_text_only_sokoban_end_to_end_is_reproducible(tiny_text):
    model, tokenizer = tiny_text
    env_cfg = EnvConfig(env_id="envs_visual/Sokoban-v0", text_only=True, prompt_format="no_think")
    cfg = RolloutConfig(num_groups=2, group_size=2, max_turns=2, max_new_tokens=12)
    batches = [
        RolloutManager(env_cfg, cfg, HFEngine(model, tokenizer), tokenizer, seed=3).train_batch()
        for _ in range(2)
    ]
    a, b = batches
    assert a.vision is None and torch.equal(a.input_ids, b.input_ids)
    assert [t.reply for ep in a.episodes for t in ep.turns] == [
        t.reply for ep in b.episodes for t in ep.turns
    ]
    assert a.loss_mask.sum() == sum(t.num_tokens for ep in a.episodes for t in ep.turns)
    assert "#" in a.episodes[0].turns[0].observation  # the XSB grid as text
    for ep in a.episodes:  # each turn's state key is the grid it was shown (GiGPO's anchor states)
        assert all(t.observation.endswith(t.state) for t in ep.turns)
    logp = a.rollout_logprobs[a.loss_mask]
    assert (logp <= 0).all() and (logp < 0).any()


def test_evaluate_plays_the_fixed_validation_levels(processor):
    m = manager(processor, [GOOD, "oops"], max_turns=2)
    summary, episodes = evaluate(m, num_levels=2, group_size=3)
    val_levels = [s.level for s in m.seeds.validation(2, 1)]  # the first held-out seeds of their range
    assert sorted({ep.level_seed for ep in episodes}) == val_levels and summary.k == 3
    assert min(val_levels) >= VAL_SEED_START
    assert (
        summary.num_episodes == 6
        and 0 <= summary.success_ci_low <= summary.success_rate <= summary.success_ci_high
    )
    assert summary.format_error_rate > 0 and m.seeds.train_levels_used == 0
    again, _ = evaluate(m, num_levels=2, group_size=3)
    assert again == summary


def test_play_episodes_gives_the_records_of_collect_without_rows(processor):
    replies = [GOOD, "oops", "<answer>Up</answer>"]
    collecting, playing = manager(processor, replies), manager(processor, replies)
    seeds = collecting.seeds.validation(2, 3)
    collected, played = collecting.collect(seeds).episodes, playing.play_episodes(seeds)

    def outcome(episodes):
        return [
            (ep.level_seed, ep.end_reason, ep.episode_return, [t.reply for t in ep.turns]) for ep in episodes
        ]

    assert outcome(played) == outcome(collected) and len(played) == 6
    assert sum(len(ep.turns) for ep in played) > 6  # episodes ran past their first turn


def test_random_start_reaches_training_episodes_only(processor, monkeypatch):
    m = manager(processor, [GOOD], num_groups=8, group_size=2, max_turns=1, random_start=1.0)
    starts = [ep.turns[0].state for ep in m.train_batch().episodes]
    assert all(starts[i] == starts[i + 1] for i in range(0, 16, 2))  # a group shares its start
    assert any("S" in state for state in starts)  # the player stands elsewhere: S shows
    _, validation = evaluate(m, num_levels=8, group_size=1)
    assert all("S" not in ep.turns[0].state for ep in validation)  # validation starts on S
    monkeypatch.setattr(SokobanEnv, "supports_random_start", False)  # an env without exploring starts
    with pytest.raises(ValueError, match="random_start"):
        manager(processor, [GOOD], env_id="envs_visual/Sokoban-v0", random_start=0.5)


def test_sampled_image_tokens_are_cut_so_contexts_stay_valid(processor):
    # An untrained model can sample <|image_pad|>; fed back, it would pair with no image.
    replies = ["<think>a<|image_pad|>b</think><answer>Up</answer>", "<|vision_start|>x"]
    m = manager(processor, replies, max_turns=3, num_groups=1, group_size=2)
    batch = m.train_batch()
    cut = batch.episodes[0].turns[0]
    assert cut.finish_reason == "banned_token" and cut.reply == "<think>a"
    assert batch.episodes[1].end_reason == "banned_token" and not batch.episodes[1].turns
    pads = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (batch.input_ids == pads).sum() == batch.vision.patch_counts().sum() // 4


@pytest.mark.parametrize(
    ("env_id", "window", "instructions_in_system"),
    [
        ("envs_visual/FrozenLake-v0", None, False),
        ("envs_visual/Sokoban-v0", 0, False),
        ("envs_visual/Sokoban-v0", 0, True),
    ],
)
def test_tiny_vlm_rollout_scores_back_to_the_sampled_logprobs(
    tiny_vlm_path, env_id, window, instructions_in_system
):
    # The row the update scores is the context the engine sampled from, so the model's log-probs of
    # the sampled tokens on the batch rows equal the engine's (up to batching noise), once the engine's
    # renormalisation over the non-banned tokens (image tokens are never sampled) is taken into account.
    model, processor = load_policy(tiny_vlm_path)
    env_cfg = EnvConfig(
        env_id=env_id, prompt_format="free_think", instructions_in_system=instructions_in_system
    )
    cfg = RolloutConfig(num_groups=2, group_size=2, max_turns=3, max_new_tokens=8, window=window)
    manager = RolloutManager(env_cfg, cfg, HFEngine(model, processor), processor, seed=1)
    batch = manager.train_batch()
    assert batch.vision is not None and (len(batch) == 4) == (window is None)  # window 0: turn 3 = new row
    if instructions_in_system:  # nothing pinned: one row and one image per turn
        num_turns = sum(len(ep.turns) for ep in batch.episodes)
        assert len(batch) == num_turns == len(batch.vision) and num_turns > 4
    assert batch.loss_mask.sum() == sum(t.num_tokens for ep in batch.episodes for t in ep.turns)
    assert batch.turn_end.sum() == sum(len(ep.turns) for ep in batch.episodes)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.vision, 4, False)
        inputs = model_inputs(model.config, batch.input_ids, batch.attention_mask, batch.vision)
        next_token_logp = torch.log_softmax(model(**inputs).logits.float(), dim=-1)  # (B, L, V)
    banned = sorted(manager.codec.banned_token_ids)
    banned_mass = next_token_logp[..., banned].logsumexp(-1).exp()  # (B, L): P(banned) for token i+1
    renormalised = logp.clone()
    renormalised[:, 1:] -= torch.log1p(-banned_mass[:, :-1])
    sampled = batch.loss_mask
    assert (banned_mass[:, :-1][sampled[:, 1:]] > 1e-3).all()  # the correction is not negligible
    assert torch.allclose(renormalised[sampled], batch.rollout_logprobs[sampled], atol=1e-3)


def test_blank_image_episodes_replay_the_levels_with_black_frames(processor):
    m = manager(processor, [GOOD], max_turns=2)
    seeds = m.seeds.validation(2, 1)
    seen = m.play_episodes(seeds)
    real_calls = len(m.engine.calls)
    blank = m.play_episodes(seeds, blank_images=True)
    real_prompts, blank_prompts = m.engine.calls[0], m.engine.calls[real_calls]
    assert all(np.asarray(image).any() for p in real_prompts for image in p.images)
    assert all(not np.asarray(image).any() for p in blank_prompts for image in p.images)
    assert [p.token_ids for p in blank_prompts] == [p.token_ids for p in real_prompts]  # only pixels differ
    assert [ep.level_seed for ep in blank] == [ep.level_seed for ep in seen]
    assert blank[0].turns[0].frame.any()  # the records keep the true frames (GIFs show the real state)
