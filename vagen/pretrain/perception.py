"""Perception pretraining: teach a VLM to read the rendered game state, with no actions in sight.

    python -m vagen.pretrain.perception --config configs/frozenlake_tiny.yaml [--out DIR] [k=v ...]

The published setting starts RL from a pretrained VLM: it can say what is in an image but has never
been told how to play. The tiny model of this repo starts from random weights and cannot see, so RL
(and even solver imitation, docs/research/probe-log.md) sits on a blind plateau. This step gives it
eyes the same way a VLM gets them -- by captioning -- on the game's own images:

1. States: training levels of the run's seed schedule (validation layouts stay held out), each after a
   random walk of 0..`max_walk` steps that never ends the episode (a step that would terminate is
   re-drawn), so the player stands on many cells. For an env with few layouts (MiniGrid LavaGap has 8),
   a share `perception.shuffle_cells` of the training states get their cells shuffled (`shuffle_cells`).
2. Sample: one user turn "<image> + `PROMPT`", reply = the env's text grid (`env.unwrapped.text_grid()`,
   the text-only mode's observation) with spaces between cells, e.g. "P F F F\nF H F H\n...".
   Loss on the reply tokens only (the masked cross-entropy of vagen.pretrain.supervised).
3. Score on validation levels by teacher-forced argmax: token accuracy of the grid reply and the rate
   of grids read exactly (every token right, i.e. what greedy decoding would write).

The result is a save_pretrained folder, cached in `$VAGEN_CACHE/perception/<key>` (perception_dir).
With `perception.enabled: true` a recipe's warm start and RL start from it instead of `model.path`
(`start_model`), so they start from a model that can see. Nothing here knows which action is good: the
format warm start on top still plays at random. Defaults (PerceptionConfig) measured on visual FrozenLake
4x4 with flat tiles: held-out grids read exactly 0.34 after 1,500 steps, 0.90 after 3,000; the loss drops
from ~0.13 to < 0.01 when the model starts to see.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from vagen.config import EnvConfig, PerceptionConfig, RolloutConfig, RunConfig, load_config_or_exit
from vagen.models.loading import load_policy, model_inputs
from vagen.models.tiny import cache_root, resolve_model_path
from vagen.pretrain.supervised import cached_report, inputs_key, save_atomically, train_supervised
from vagen.pretrain.teachers import cell_grid
from vagen.rollout.assembly import ChatCodec, EpisodeAssembler
from vagen.rollout.batch import EpisodeRecord, RolloutBatch, build_batch
from vagen.rollout.manager import fit_env_to_model, make_language_env, read_chat_template, seed_schedule

PROMPT = "Write the grid you see, one row per line."


def walk_states(env_cfg: EnvConfig, level_seeds: list[int], max_walk: int, seed: int):
    """(image, grid text) per level: the state after a random walk of 0..max_walk non-terminating steps."""
    rng = np.random.default_rng(seed)
    env = make_language_env(env_cfg, local=True).env
    for level in level_seeds:
        env.reset(seed=level)
        game = env.unwrapped
        for _ in range(int(rng.integers(0, max_walk + 1))):
            for action in rng.permutation(env.action_space.n):
                trial = copy.deepcopy(game)
                _, _, terminated, truncated, _ = trial.step(int(action))
                if not (terminated or truncated):
                    game.step(int(action))
                    break
        yield game.render(), cell_grid(game)


def shuffle_cells(image: np.ndarray, grid: str, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """The state's cells in a random order, image tiles and grid characters permuted together: a layout
    the env may never make, so the reader learns to read each cell instead of recalling the training
    layouts. Valid where each cell is drawn on its own tile, as MiniGrid draws them."""
    cells = [row.split(" ") for row in grid.split("\n")]
    height, width = len(cells), len(cells[0])
    size = image.shape[0] // height
    if image.shape[:2] != (height * size, width * size):
        raise ValueError(f"a {image.shape[:2]} image is not {height} x {width} square cells")
    tiles = (
        image.reshape(height, size, width, size, -1).swapaxes(1, 2).reshape(height * width, size, size, -1)
    )
    order = rng.permutation(height * width)
    shuffled = tiles[order].reshape(height, width, size, size, -1).swapaxes(1, 2).reshape(image.shape)
    chars = [c for row in cells for c in row]
    rows = [" ".join(chars[i] for i in order[r * width : (r + 1) * width]) for r in range(height)]
    return np.ascontiguousarray(shuffled), "\n".join(rows)


def caption_batch(codec: ChatCodec, system_prompt: str, states) -> RolloutBatch:
    """One row per (image, grid): system + user(image, PROMPT) + assistant(grid); loss on the reply."""
    segments, records = [], []
    for index, (image, grid) in enumerate(states):
        assembler = EpisodeAssembler(codec, system_prompt, window=None, text_only=False)
        assembler.commit(assembler.prepare(f"<image>\n{PROMPT}", [image]))
        token_ids = codec.tokenizer.encode(grid, add_special_tokens=False) + codec.stop_token_ids
        assembler.add_reply(token_ids, [0.0] * len(token_ids), stopped=True)
        assembler.finish_turn(0.0, {}, "all", "all")
        segments.append(assembler.segments)
        records.append(EpisodeRecord(index, 0, index, 0))
    return build_batch(segments, records, codec.pad_token_id)


@torch.no_grad()
def grid_accuracy(model, data: RolloutBatch, micro_batch_size: int = 32) -> dict[str, float]:
    """Teacher-forced argmax on the reply tokens: token accuracy and the rate of rows all right."""
    correct = []
    for start in range(0, len(data), micro_batch_size):
        rows = data.select(list(range(start, min(start + micro_batch_size, len(data)))))
        inputs = model_inputs(model.config, rows.input_ids, rows.attention_mask, rows.vision)
        logits = model(**inputs, use_cache=False).logits[:, :-1]
        hit = logits.argmax(-1) == rows.input_ids[:, 1:]
        mask = rows.loss_mask[:, 1:]
        correct += [(hit[b][mask[b]]).tolist() for b in range(len(rows))]
    tokens = [x for row in correct for x in row]
    return {"token_accuracy": float(np.mean(tokens)), "grid_exact": float(np.mean([all(r) for r in correct]))}


def pretrain_perception(
    model_path: str,
    env_cfg: EnvConfig,
    rollout_cfg: RolloutConfig,
    cfg: PerceptionConfig,
    out_dir: str,
    log=print,
) -> dict:
    """The whole pretraining (module docstring); writes model + processor + report to `out_dir`."""
    if env_cfg.text_only:
        raise ValueError("perception pretraining reads the env's images, but env.text_only is true")
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, processor = load_policy(model_path)
    codec = ChatCodec(processor, read_chat_template(rollout_cfg.chat_template))
    system_prompt = make_language_env(env_cfg, local=True).system_prompt
    seeds = seed_schedule(env_cfg, cfg.seed)  # its levels: training ones, validation layouts held out
    train_levels = [s.level for s in seeds.next_train(cfg.samples, 1)]
    val_levels = [s.level for s in seeds.validation(cfg.eval_samples, 1)]
    rng = np.random.default_rng(cfg.seed)
    train_states = (  # a generator, as walk_states: caption_batch holds the images once
        shuffle_cells(image, grid, rng) if rng.random() < cfg.shuffle_cells else (image, grid)
        for image, grid in walk_states(env_cfg, train_levels, cfg.max_walk, cfg.seed)
    )
    train = caption_batch(codec, system_prompt, train_states)
    val = caption_batch(codec, system_prompt, walk_states(env_cfg, val_levels, cfg.max_walk, cfg.seed + 1))
    log(
        f"perception data: {len(train)} train / {len(val)} validation samples "
        f"({time.perf_counter() - started:.0f}s)"
    )
    before = grid_accuracy(model, val)
    losses = train_supervised(model, train, cfg.optim, cfg.seed, log)
    after = grid_accuracy(model, val)
    report = {
        "base_model": str(model_path),
        "before": before,
        "after": after,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": time.perf_counter() - started,
        "perception": asdict(cfg),
    }
    log(f"perception before: {before}\nperception after:  {after}")
    save_atomically(model, processor, report, Path(out_dir))
    return report


# What the captions depend on: the env's images and levels, not its rewards or reply format.
ENV_FIELDS_IN_KEY = ("env_id", "env_kwargs", "text_only")
ROLLOUT_FIELDS_IN_KEY = ("chat_template",)


def pretraining_settings(cfg: PerceptionConfig) -> dict:
    """The settings that shape the pretrained model: all of `cfg` but `enabled`."""
    return {k: v for k, v in asdict(cfg).items() if k != "enabled"}


def perception_dir(
    model_path: str, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, cfg: PerceptionConfig
) -> Path:
    """`$VAGEN_CACHE/perception/<key>`: inputs_key over the base model, the env's images and levels and
    this config (less `enabled`)."""
    key = inputs_key(
        resolve_model_path(model_path),
        {
            "env": {k: getattr(env_cfg, k) for k in ENV_FIELDS_IN_KEY},
            "rollout": {k: getattr(rollout_cfg, k) for k in ROLLOUT_FIELDS_IN_KEY},
            "perception": pretraining_settings(cfg),
        },
    )
    return cache_root() / "perception" / key


def perception_model(
    model_path: str, env_cfg: EnvConfig, rollout_cfg: RolloutConfig, cfg: PerceptionConfig, log=print
) -> str:
    """The pretrained folder for these inputs, built on the first call and then reused."""
    target = perception_dir(model_path, env_cfg, rollout_cfg, cfg)
    if cached_report(target) is not None:
        log(f"perception pretraining cached: {target}")
    else:
        log(f"perception pretraining ({cfg.optim.steps} steps) -> {target}")
        pretrain_perception(model_path, env_cfg, rollout_cfg, cfg, str(target), log)
    return str(target)


def start_model(cfg: RunConfig, log=print) -> str:
    """The base a run's warm start builds on: `cfg.model.path`, or its perception-pretrained copy (cached)
    when `cfg.perception.enabled`."""
    if not cfg.perception.enabled:
        return cfg.model.path
    return perception_model(cfg.model.path, cfg.env, cfg.rollout, cfg.perception, log)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML run config (its env and model.path)")
    parser.add_argument("--out", default=None, help="write the model here instead of the cache")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. perception.optim.steps=1500")
    args = parser.parse_args(argv)
    cfg = load_config_or_exit(args.config, args.overrides)
    fit_env_to_model(cfg.env, cfg.model.path)
    if args.out is None:
        print(perception_model(cfg.model.path, cfg.env, cfg.rollout, cfg.perception))
    else:
        report = pretrain_perception(cfg.model.path, cfg.env, cfg.rollout, cfg.perception, args.out)
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
