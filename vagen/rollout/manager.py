"""StarPO rollout manager: G groups x n members of multi-turn episodes, played in lock step.

Each turn, every live episode's context is assembled (vagen.rollout.assembly), all of them go to ONE
engine.generate call, and each reply is parsed and executed by its LanguageEnv. An episode ends on
success or failure (env terminated / truncated), after `max_turns` replies, once it has executed
`max_actions_per_episode` actions, or when the next prompt plus `max_new_tokens` would exceed
`max_context_tokens` (that turn is then not played). Finished episodes stop generating.
Engines never sample image tokens (SamplingParams.banned_token_ids); should an engine ignore the ban,
a reply holding one (which could not be fed back) is cut before it, like a length cut, and one that
starts with it ends the episode ("banned_token").
With `env.remote`, the games run on an env server (envs_visual.service; docs/env-service.md): the resets of
a rollout go in one request per server, a turn's steps in one request per server per action of the
replies (envs_visual.remote.step_all), and a step the service fails (after its retries) ends only that episode
("env_error", the turn kept with no action executed and no env reward); a reset it fails drops the
episode's group from the rollout. Both are counted in `env_errors` (rollout/env_errors) and logged.
"""

import functools
import inspect
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from transformers import AutoConfig

import envs_visual  # noqa: F401  (registers the environments)
from envs_visual.language import LanguageEnv
from envs_visual.remote import EnvServiceError, ServiceClient, reset_all, step_all
from vagen.config import EnvConfig, RolloutConfig
from vagen.models.adapters import adapter_for
from vagen.models.tiny import resolve_model_path
from vagen.rollout.assembly import ActionReadout, ChatCodec, EpisodeAssembler, action_readout
from vagen.rollout.batch import END_REASONS, EpisodeRecord, RolloutBatch, TurnRecord, build_batch
from vagen.rollout.engines.base import Generation, GenerationEngine, Prompt, SamplingParams
from vagen.rollout.reasoning import score_reasoning
from vagen.rollout.seeds import EpisodeSeeds, SeedSchedule, derive_seed


@functools.cache
def service_client(url: str, timeout_s: float, retries: int) -> ServiceClient:
    """One connection pool per env server and process."""
    return ServiceClient(url, timeout_s, retries)


def make_env(cfg: EnvConfig, local: bool = False) -> gym.Env:
    """The game: a session on the env server `env.remote` if set (and not `local`), else in this process."""
    if cfg.remote is None or local:
        return gym.make(cfg.env_id, **cfg.env_kwargs)
    return service_client(cfg.remote, cfg.remote_timeout_s, cfg.remote_retries).make(
        cfg.env_id, cfg.env_kwargs
    )


def make_language_env(cfg: EnvConfig, local: bool = False) -> LanguageEnv:
    """The game behind the language layer. `local`: in this process even with `env.remote` (the warm
    start's teachers and the perception data read the game itself: its solver, copies of it)."""
    return LanguageEnv(
        make_env(cfg, local),
        prompt_format=cfg.prompt_format,
        max_actions_per_turn=cfg.max_actions_per_turn,
        format_reward=cfg.format_reward,
        format_penalty=cfg.format_penalty,
        text_only=cfg.text_only,
        cell_separator=cfg.cell_separator,
        instructions_in_system=cfg.instructions_in_system,
        instructions=cfg.instructions,
        action_feedback=cfg.action_feedback,
    )


def fit_env_to_model(cfg: EnvConfig, model_path: str) -> None:
    """An env that takes `cell_size` and is not given one renders one cell per visual token of the model
    at `model_path` (its adapter's merged_token_pixels: 28 px for Qwen2.5-VL, 32 px for Qwen3-VL), so the
    processor never resizes a cell across token borders. Sets cfg.env_kwargs["cell_size"] in place, only
    where it differs from the env's default (so configs and cache keys of such runs stay as they were)."""
    if "cell_size" in cfg.env_kwargs:
        return
    env_class = load_env_creator(gym.spec(cfg.env_id).entry_point)
    parameter = inspect.signature(env_class).parameters.get("cell_size")
    if parameter is None:
        return
    config = AutoConfig.from_pretrained(resolve_model_path(model_path), local_files_only=True)
    pixels = adapter_for(config).merged_token_pixels(config)
    if pixels is not None and pixels != parameter.default:
        cfg.env_kwargs["cell_size"] = pixels


def check_random_start(env_cfg: EnvConfig, share: float, name: str) -> None:
    """Exploring starts (share > 0) need an env that can start elsewhere than its start state (one with
    `supports_random_start`: envs_visual.contract)."""
    if share <= 0:
        return
    env = make_env(env_cfg)
    supported = getattr(env.unwrapped, "supports_random_start", False)
    env.close()
    if not supported:
        raise ValueError(
            f"{name}={share} needs an env with random starts (supports_random_start); "
            f"{env_cfg.env_id} has none"
        )


def episode_assembler(
    codec: ChatCodec | None, env: LanguageEnv, window: int | None, keep_vision: bool = True
) -> EpisodeAssembler:
    """The assembler of one episode of `env` (RL rollouts and teacher episodes alike): its system prompt,
    its modality, and the first turn pinned in a windowed context unless the instructions are in the
    system prompt."""
    return EpisodeAssembler(
        codec,
        env.system_prompt,
        window,
        env.text_only,
        pin_first_turn=not env.instructions_in_system,
        keep_vision=keep_vision,
    )


def layout_probe(cfg: EnvConfig) -> Callable[[int], str] | None:
    """seed -> the layout key of the level that seed makes (one private env, reset only); None for an env
    without `layout_key`, whose levels are then split by seed range alone."""
    env = make_env(cfg)
    if not hasattr(env.unwrapped, "layout_key"):
        return None

    def layout_of(seed: int) -> str:
        env.reset(seed=seed)
        return env.unwrapped.layout_key

    return layout_of


def seed_schedule(env_cfg: EnvConfig, seed: int) -> SeedSchedule:
    """The level seeds of a run with base seed `seed`: validation layouts never appear in training."""
    return SeedSchedule(seed, layout_of=layout_probe(env_cfg))


def read_chat_template(path: str | None) -> str | None:
    return Path(path).read_text() if path is not None else None


class _Reply(NamedTuple):
    text: str
    finish_reason: str
    num_tokens: int


class _Episode:
    """Live state of one episode during a rollout."""

    def __init__(self, seeds: EpisodeSeeds, env: LanguageEnv, assembler: EpisodeAssembler) -> None:
        self.env = env
        self.assembler = assembler
        self.record = EpisodeRecord(seeds.group, seeds.member, seeds.level, seeds.dynamics)
        self.observation = None
        self.seen_descriptions: set[str] = set()
        self.live = True

    def end(self, reason: str) -> None:
        if reason not in END_REASONS:
            raise ValueError(f"end reason must be one of {END_REASONS}, got {reason!r}")
        self.live = False
        self.record.end_reason = reason
        images = self.observation.images
        self.record.final_frame = images[0] if images else None
        self.record.final_state = self.observation.state
        self.record.new_segments_by_template = self.assembler.num_new_segments_by_template


class RolloutManager:
    """Collects RolloutBatches: `train_batch()` on fresh training levels, `collect(seeds)` on given ones;
    `play_episodes(seeds)` plays them for their records only (validation: no token rows are collated).

    `timings` holds the seconds spent in the last collect: generate, env (reset + step, rendering
    included), assemble (templates, tokenising, images), reward (reasoning matcher), batch (collation);
    `env_errors` the episodes the env service failed in it (module docstring).
    """

    def __init__(
        self,
        env_cfg: EnvConfig,
        cfg: RolloutConfig,
        engine: GenerationEngine,
        processor_or_tokenizer,
        seed: int = 0,
    ) -> None:
        self.env_cfg = env_cfg
        self.cfg = cfg
        self.engine = engine
        self.seed = seed  # of the sampling and (through the seed schedule) of the env dynamics
        self.codec = ChatCodec(processor_or_tokenizer, read_chat_template(cfg.chat_template))
        self.seeds = seed_schedule(env_cfg, seed)
        self.envs: list[LanguageEnv] = []
        check_random_start(env_cfg, cfg.random_start, "rollout.random_start")
        self.timings: dict[str, float] = {}
        self.env_errors = 0
        self._readout: ActionReadout | None = None  # where replies choose their action (same for all envs)

    def train_batch(self) -> RolloutBatch:
        """G groups x n members on the next G training levels (exploring starts if `random_start`)."""
        seeds = self.seeds.next_train(self.cfg.num_groups, self.cfg.group_size)
        return self.collect(seeds, training=True)

    def validation_episodes(
        self, num_groups: int, group_size: int, temperature: float | None = None
    ) -> list[EpisodeRecord]:
        """The first `num_groups` validation levels x `group_size` members (the same every call)."""
        return self.play_episodes(self.seeds.validation(num_groups, group_size), temperature)

    def sampling_params(
        self, episode_seeds: list[EpisodeSeeds], turn: int, temperature: float | None
    ) -> SamplingParams:
        return SamplingParams(
            temperature=self.cfg.temperature if temperature is None else temperature,
            top_p=self.cfg.top_p,
            top_k=self.cfg.top_k,
            max_new_tokens=self.cfg.max_new_tokens,
            stop_token_ids=list(self.codec.stop_token_ids),
            banned_token_ids=sorted(self.codec.banned_token_ids),
            # Keyed by the levels played: a rollout is reproducible, validation replays the same draws.
            seed=derive_seed(self.seed, episode_seeds[0].level, len(episode_seeds), turn),
        )

    def collect(
        self,
        episode_seeds: list[EpisodeSeeds],
        temperature: float | None = None,
        training: bool = False,
    ) -> RolloutBatch:
        """Play one episode per entry of `episode_seeds` to its end; returns their rows.
        Training episodes take exploring starts (`random_start`); others start on the level's start."""
        episodes = self._play_all(episode_seeds, temperature, training, keep_rows=True)
        start = time.perf_counter()
        batch = build_batch(
            [e.assembler.segments for e in episodes], [e.record for e in episodes], self.codec.pad_token_id
        )
        self.timings["batch"] = time.perf_counter() - start
        return batch

    def play_episodes(
        self, episode_seeds: list[EpisodeSeeds], temperature: float | None = None, blank_images: bool = False
    ) -> list[EpisodeRecord]:
        """Like `collect` from the levels' starts, but only the episodes' records: no rows are collated
        and no image patches kept (bench/validation_bench.py: peak memory on 512 Sokoban levels)."""
        episodes = self._play_all(
            episode_seeds, temperature, False, keep_rows=False, blank_images=blank_images
        )
        return [episode.record for episode in episodes]

    def _play_all(
        self,
        episode_seeds: list[EpisodeSeeds],
        temperature: float | None,
        training: bool,
        keep_rows: bool,
        blank_images: bool = False,
    ) -> list[_Episode]:
        reset_options = {"random_start": self.cfg.random_start} if training else {}
        timings: dict[str, float] = defaultdict(float)
        self.env_errors = 0
        while len(self.envs) < len(episode_seeds):
            self.envs.append(make_language_env(self.env_cfg))
        envs = self.envs[: len(episode_seeds)]
        options = [{**reset_options, "dynamics_seed": seeds.dynamics} for seeds in episode_seeds]
        start = time.perf_counter()
        reset_all([env.env for env in envs], [seeds.level for seeds in episode_seeds], options)
        timings["env"] += time.perf_counter() - start
        episodes, lost_groups = [], set()
        for seeds, env, reset_option in zip(episode_seeds, envs, options, strict=True):
            assembler = episode_assembler(self.codec, env, self.cfg.window, keep_vision=keep_rows)
            episode = _Episode(seeds, env, assembler)
            start = time.perf_counter()
            env.max_actions_per_turn = self.env_cfg.max_actions_per_turn
            try:
                episode.observation, _ = env.reset(seed=seeds.level, options=reset_option)
                episodes.append(episode)
            except EnvServiceError as err:
                self._count_env_error(seeds, "reset", err, "its group is dropped")
                lost_groups.add(seeds.group)
            timings["env"] += time.perf_counter() - start
        self.env_errors += sum(episode.record.group in lost_groups for episode in episodes)  # dropped too
        episodes = [episode for episode in episodes if episode.record.group not in lost_groups]
        if not episodes:
            raise EnvServiceError(f"the env service at {self.env_cfg.remote} failed every reset of a rollout")
        for turn in range(self.cfg.max_turns):
            playing, prompts = [], []
            start = time.perf_counter()
            for episode in (e for e in episodes if e.live):
                prompt = self._prompt(episode, turn, blank_images)
                if prompt is not None:
                    playing.append(episode)
                    prompts.append(prompt)
            timings["assemble"] += time.perf_counter() - start
            if not playing:
                break
            start = time.perf_counter()
            generations = self.engine.generate(
                prompts, self.sampling_params(episode_seeds, turn, temperature)
            )
            timings["generate"] += time.perf_counter() - start
            stepping = []
            for episode, generation in zip(playing, generations, strict=True):
                reply = self._take_reply(episode, generation, timings)
                if reply is not None:
                    stepping.append((episode, reply))
            if self.env_cfg.remote is not None:
                start = time.perf_counter()
                plans = [episode.env.planned_actions(reply.text) for episode, reply in stepping]
                step_all([episode.env.env for episode, _ in stepping], plans)
                timings["env"] += time.perf_counter() - start
            for episode, reply in stepping:
                self._play(episode, reply, turn, timings)
        for episode in episodes:
            if episode.live:
                episode.end("max_turns")
        self.timings = dict(timings)
        return episodes

    def _prompt(self, episode: _Episode, turn: int, blank_images: bool = False) -> Prompt | None:
        """The engine prompt of the episode's next turn, or None (episode ended) past the context budget."""
        images = episode.observation.images
        if blank_images:  # the same prompt with every pixel black: does the policy read the image?
            images = [np.zeros_like(image) for image in images]
        pending = episode.assembler.prepare(episode.observation.text, images)
        if pending.prompt_length + self.cfg.max_new_tokens <= self.cfg.max_context_tokens:
            token_ids, images = episode.assembler.commit(pending)
            return Prompt(token_ids=token_ids, images=images)
        if turn == 0:
            raise ValueError(
                f"the first prompt has {pending.prompt_length} tokens; with max_new_tokens="
                f"{self.cfg.max_new_tokens} it exceeds "
                f"rollout.max_context_tokens={self.cfg.max_context_tokens}"
            )
        episode.assembler.withdraw()
        episode.end("context_budget")
        return None

    def _without_banned_tokens(self, generation: Generation) -> tuple[list[int], list[float], str]:
        """The sampled ids up to the first image token (the adapter's context_only_tokens), if any: a
        prefix of what was sampled, treated like a length cut (finish reason "banned_token")."""
        token_ids, logprobs = list(generation.token_ids), list(generation.logprobs)
        for position, token_id in enumerate(token_ids):
            if token_id in self.codec.banned_token_ids:
                return token_ids[:position], logprobs[:position], "banned_token"
        return token_ids, logprobs, generation.finish_reason

    def _take_reply(
        self, episode: _Episode, generation: Generation, timings: dict[str, float]
    ) -> _Reply | None:
        """Record the sampled reply in the episode's context, and set how many actions it may play; None
        (the episode ended) if it begins with a banned token."""
        start = time.perf_counter()
        token_ids, logprobs, finish_reason = self._without_banned_tokens(generation)
        if not token_ids:
            episode.end("banned_token")
            return None
        stopped = token_ids[-1] in self.codec.stop_token_ids
        text = episode.assembler.add_reply(token_ids, logprobs, stopped)
        remaining = self.cfg.max_actions_per_episode - episode.record.num_actions
        episode.env.max_actions_per_turn = min(self.env_cfg.max_actions_per_turn, remaining)  # exact budget
        timings["assemble"] += time.perf_counter() - start
        return _Reply(text, finish_reason, len(token_ids))

    def _play(self, episode: _Episode, taken: _Reply, turn: int, timings: dict[str, float]) -> None:
        """Execute the reply, score it, and end the episode if it is over."""
        assembler, seen, reply = episode.assembler, episode.observation, taken.text
        start = time.perf_counter()
        try:
            observation, env_reward, terminated, truncated, info = episode.env.step(reply)
        except EnvServiceError as err:
            self._count_env_error(episode.record, "step", err, "the episode ends")
            observation, env_reward, terminated, truncated, info = lost_step(episode, reply)
        timings["env"] += time.perf_counter() - start
        start = time.perf_counter()
        parse = info["parse"]
        reasoning = score_reasoning(
            parse.texts,
            info["state_facts_before"],
            info["state_facts_after"],
            self.env_cfg,
            episode.seen_descriptions,
        )
        reward = float(env_reward) + reasoning.reward
        timings["reward"] += time.perf_counter() - start
        start = time.perf_counter()
        action_char = action_token_id = None
        if info["actions_executed"]:
            if self._readout is None:  # the token the mpo update reads its policy at
                self._readout = action_readout(self.codec, episode.env.action_names)
            readout = self._readout
            action_char = parse.action_starts[0] + readout.char_offset
            action_token_id = readout.token_ids[episode.env.action_names.index(info["actions_executed"][0])]
        assembler.finish_turn(
            reward, parse.spans, self.cfg.loss_spans, self.cfg.adv_spans, action_char, action_token_id
        )
        timings["assemble"] += time.perf_counter() - start
        record = episode.record
        record.turns.append(
            TurnRecord(
                observation=seen.text,
                frame=seen.images[0] if seen.images else None,
                reply=reply,
                finish_reason=taken.finish_reason,
                num_tokens=taken.num_tokens,
                format_ok=bool(parse.format_ok),
                actions=list(info["actions_executed"]),
                num_invalid=int(info["num_invalid"]),
                env_reward=float(env_reward),
                reasoning_reward=reasoning.reward,
                grounding=reasoning.grounding,
                worldmodel=reasoning.worldmodel,
                reward=reward,
                texts=dict(parse.texts),
                state=seen.state,
                features=seen.features,
            )
        )
        record.episode_return += reward
        record.num_actions += len(info["actions_executed"])
        record.success = bool(info.get("success", False))
        episode.observation = observation
        if info.get("env_error"):
            episode.end("env_error")
        elif terminated or truncated:
            episode.end("success" if record.success else "failure" if terminated else "truncated")
        elif record.num_actions >= self.cfg.max_actions_per_episode:
            episode.end("action_budget")
        elif turn + 1 == self.cfg.max_turns:
            episode.end("max_turns")

    def _count_env_error(self, seeds, call: str, err: EnvServiceError, outcome: str) -> None:
        """Count one episode the env service failed, and say so (group, member, which call, why)."""
        self.env_errors += 1
        where = f"group {seeds.group} member {seeds.member}"
        print(f"[vagen] WARNING env service {call} failed ({where}): {err}; {outcome}", flush=True)


def lost_step(episode: _Episode, reply: str) -> tuple:
    """A step the env service failed, as a step result: the reply parsed here, nothing executed, no env
    reward, the observation unchanged, truncated, and `env_error` set in the info."""
    env = episode.env
    parse = env.parse(reply)
    facts = env.env.unwrapped.describe_state()  # the last state the service reported
    info = {
        "parse": parse,
        "actions_executed": [],
        "num_invalid": parse.num_invalid,
        "success": False,
        "state_facts_before": facts,
        "state_facts_after": facts,
        "env_error": True,
    }
    return episode.observation, 0.0, False, True, info
