"""Full multi-turn StarPO rollout on the tiny VLM: episodes/s and where the time goes.

64 episodes (16 groups x 4) x 5 turns, HF engine, visual FrozenLake 4x4 and Sokoban 6x6, free_think,
48 new tokens per reply at temperature 1 (the untrained tiny model rarely answers in format, so
episodes run all 5 turns). Time is split into generation (engine.generate), env stepping (reset +
step, minus rendering), rendering (the envs' tile renderer), processing (chat template, tokenising,
image patches, masks) and the reasoning matcher + batch collation. For scale it also times the naive
alternative to incremental assembly: re-rendering and re-processing each episode's whole conversation
every turn. Two more runs replace the model by scripted valid replies, so that actions execute and
the env's own cost (stepping, rendering) shows.
Usage: .venv/bin/python bench/episode_bench.py   (about 1-2 minutes; kept in bench/results/episode_bench.txt)
"""

import os
import platform
import time

import torch

from envs_visual.render import TileRenderer
from vagen.config import EnvConfig, RolloutConfig
from vagen.models.loading import load_policy
from vagen.rollout.assembly import user_message
from vagen.rollout.engines.base import Generation
from vagen.rollout.engines.hf import HFEngine
from vagen.rollout.manager import RolloutManager

ENVS = {"FrozenLake 4x4": ("envs_visual/FrozenLake-v0", {}), "Sokoban 6x6": ("envs_visual/Sokoban-v0", {})}
RENDER_SECONDS = [0.0]
RENDER_CALLS = [0]


def timed_render(original):
    def render(self, codes):
        start = time.perf_counter()
        RENDER_CALLS[0] += 1
        try:
            return original(self, codes)
        finally:
            RENDER_SECONDS[0] += time.perf_counter() - start

    return render


class ScriptedEngine:
    """Valid replies without a model: shows env stepping and rendering with actions actually running."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0
        moves = ["Down, Right", "Right, Down, Down", "Left, Up", "Up, Right, Right"]
        self.replies = [f"<think>I should move {m.lower()} now.</think><answer>{m}</answer>" for m in moves]

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for i in range(len(prompts)):
            ids = self.tokenizer.encode(self.replies[(self.calls + i) % 4], add_special_tokens=False)
            out.append(Generation(ids + list(params.stop_token_ids), [0.0] * (len(ids) + 1), "stop"))
        return out

    def sync_weights(self, model):
        pass


def full_reprocessing_seconds(manager: RolloutManager, batch) -> float:
    """What assembling each turn from scratch would cost: render + process the whole conversation."""
    codec, start = manager.codec, time.perf_counter()
    for episode in batch.episodes:
        messages = [{"role": "system", "content": manager.envs[0].system_prompt}]
        images = []
        for turn in episode.turns:
            frames = [turn.frame] if turn.frame is not None else []
            images += frames
            messages.append(user_message(turn.observation, len(frames), text_only=not frames))
            codec.encode(codec.render(messages, add_generation_prompt=True), images)
            messages.append({"role": "assistant", "content": turn.reply})
    return time.perf_counter() - start


def main() -> None:
    # One thread: on a shared 2-core machine, two OpenMP threads made tiny tensor ops (image patches)
    # 10-25x slower under load; one thread keeps the split stable.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, processor = load_policy("tiny-vlm")
    model.eval()
    engine = HFEngine(model, processor, max_batch_size=64)
    machine = platform.processor() or platform.machine()
    print(
        f"# episode_bench: {machine}, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}"
    )
    print("# 64 episodes = 16 groups x 4, max 5 turns, 48 new tokens, HF engine, tiny VLM (0.82M)")
    TileRenderer.render = timed_render(TileRenderer.render)
    scripted = ScriptedEngine(processor.tokenizer)
    runs = [(f"{name}, tiny VLM", env, engine) for name, env in ENVS.items()]
    runs += [(f"{name}, scripted valid replies (no model)", env, scripted) for name, env in ENVS.items()]
    for name, (env_id, kwargs), run_engine in runs:
        env_cfg = EnvConfig(env_id=env_id, env_kwargs=kwargs, prompt_format="free_think")
        cfg = RolloutConfig(num_groups=16, group_size=4, max_turns=5, max_new_tokens=48)
        manager = RolloutManager(env_cfg, cfg, run_engine, processor)
        manager.train_batch()  # warm-up (first generate call, env construction)
        RENDER_SECONDS[0], RENDER_CALLS[0] = 0.0, 0
        start = time.perf_counter()
        batch = manager.train_batch()
        total = time.perf_counter() - start
        t = manager.timings
        turns = sum(len(ep.turns) for ep in batch.episodes)
        tokens = int(batch.loss_mask.sum())
        split = {
            "generation": t["generate"],
            "env stepping": t["env"] - RENDER_SECONDS[0],
            "rendering": RENDER_SECONDS[0],
            "processing": t["assemble"],
            "reward + batch": t["reward"] + t["batch"],
        }
        other = total - sum(split.values())
        print(
            f"\n## {name}: {len(batch.episodes)} episodes, {turns} turns, {tokens} sampled tokens, "
            f"rows {tuple(batch.input_ids.shape)}"
        )
        rate = len(batch.episodes) / total
        print(f"total {total:6.2f} s   {rate:6.1f} episodes/s   {tokens / total:7.0f} tokens/s")
        actions = sum(ep.num_actions for ep in batch.episodes)
        print(
            f"  ({actions} actions executed, {RENDER_CALLS[0]} frames rendered, "
            f"{1e6 * RENDER_SECONDS[0] / max(RENDER_CALLS[0], 1):.0f} us per frame)"
        )
        for part, seconds in [*split.items(), ("other", other)]:
            print(f"  {part:15s} {seconds:7.3f} s  {seconds / total:6.1%}")
        naive = full_reprocessing_seconds(manager, batch)
        print(
            f"  processing, naive full re-tokenisation per turn: {naive:.3f} s "
            f"({naive / max(t['assemble'], 1e-9):.1f}x the incremental assembly)"
        )


if __name__ == "__main__":
    main()
