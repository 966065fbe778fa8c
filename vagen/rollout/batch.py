"""RolloutBatch: the one record every stage after the rollout reads (scoring, filtering, advantages,
update, logging), plus the per-turn records kept for logs and GIFs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from vagen.models.vision import VisionInputs
from vagen.rollout.assembly import Segment


@dataclass
class TurnRecord:
    """What happened in one turn (for logging, GIFs and evaluation)."""

    observation: str  # the observation text the turn answered
    frame: np.ndarray | None  # uint8 (H, W, 3) env image the turn saw (None in text-only mode)
    reply: str  # decoded sampled ids without the end-of-turn token
    finish_reason: str  # "stop" | "length" | "banned_token" (cut before an image token)
    num_tokens: int
    format_ok: bool
    actions: list[str]  # actions executed
    num_invalid: int  # proposed actions dropped as invalid
    env_reward: float  # LanguageEnv step reward (task + format)
    reasoning_reward: float  # grounding + world modeling - anti-template penalty
    grounding: float | None
    worldmodel: float | None
    reward: float  # env_reward + reasoning_reward, placed at the turn end
    texts: dict[str, str] = field(default_factory=dict)  # parsed tag texts
    state: str = ""  # the env's text grid of the state the turn answered (Observation.state)
    features: np.ndarray | None = None  # its one-hot state vector (Observation.features), if the env has one


# How an episode can end: the env's goal, its termination without it (lava, a hole), its truncation (its
# step limit); the rollout's turn, action and context budgets; a reply cut at a banned token; a remote env
# that failed (docs/env-service.md).
END_REASONS = (
    "success",
    "failure",
    "truncated",
    "max_turns",
    "action_budget",
    "context_budget",
    "banned_token",
    "env_error",
)


@dataclass
class EpisodeRecord:
    """One episode: its seeds, turns and outcome; `end_reason` is one of END_REASONS."""

    group: int
    member: int
    level_seed: int
    dynamics_seed: int
    turns: list[TurnRecord] = field(default_factory=list)
    final_frame: np.ndarray | None = None
    final_state: str = ""  # the env's text grid after the last turn (Observation.state)
    episode_return: float = 0.0
    success: bool = False
    num_actions: int = 0
    end_reason: str = ""
    new_segments_by_template: int = 0


@dataclass
class EpisodeView:
    """Per-episode packed view of the adv-masked tokens of all rows of each episode, in turn order.

    flat_index: (E, L') long, index into a (B, L) tensor flattened to (B*L,); 0 where mask is False
    mask:       (E, L') bool, True on real entries (each episode's count of adv-masked tokens)
    With one row per episode, running a masked estimator on the view equals running it on the rows.
    """

    flat_index: torch.Tensor
    mask: torch.Tensor

    @staticmethod
    def build(adv_mask: torch.Tensor, episode_ids: torch.Tensor, segment_ids: torch.Tensor) -> EpisodeView:
        """adv_mask: (B, L) bool; episode_ids, segment_ids: (B,) long."""
        num_episodes = int(episode_ids.max()) + 1 if len(episode_ids) else 0
        seq_len = adv_mask.shape[1]
        per_episode: list[list[torch.Tensor]] = [[] for _ in range(num_episodes)]
        for row in sorted(range(len(episode_ids)), key=lambda r: (int(episode_ids[r]), int(segment_ids[r]))):
            columns = adv_mask[row].nonzero().squeeze(-1)
            per_episode[int(episode_ids[row])].append(row * seq_len + columns)
        packed = [torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long) for parts in per_episode]
        width = max((len(p) for p in packed), default=0)
        flat_index = torch.zeros(num_episodes, width, dtype=torch.long)
        mask = torch.zeros(num_episodes, width, dtype=torch.bool)
        for e, positions in enumerate(packed):
            flat_index[e, : len(positions)] = positions
            mask[e, : len(positions)] = True
        return EpisodeView(flat_index.to(adv_mask.device), mask.to(adv_mask.device))

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """(B, L) -> (E, L'); padding entries are 0 (False for bool)."""
        packed = values.reshape(-1)[self.flat_index]  # (E, L')
        return torch.where(self.mask, packed, torch.zeros((), dtype=values.dtype, device=values.device))

    def scatter(self, packed: torch.Tensor, like: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(E, L') -> (B, L) shaped like `like`, `fill` at positions outside the view."""
        out = torch.full(like.shape, fill, dtype=packed.dtype, device=packed.device).reshape(-1)
        out[self.flat_index[self.mask]] = packed[self.mask]
        return out.reshape(like.shape)


@dataclass
class RolloutBatch:
    """Rows of token ids with everything the later stages need. B rows, L tokens (right-padded), N images,
    P patches, E episodes. An episode has one row (window None) or several (segments) in turn order.

    input_ids:        (B, L) long, pad token after each row's end
    attention_mask:   (B, L) long, 1 on real tokens
    vision:           VisionInputs | None: pixel_values (P, D) float, image_grid_thw (N, 3) long; the
                      images of row 0 first, then row 1, ... (None in text-only mode)
    images_per_row:   (B,) long, number of images of each row
    loss_mask:        (B, L) bool, M^loss: tokens that receive policy loss
    adv_mask:         (B, L) bool, M^adv: tokens the advantage recursion visits (always has turn ends)
    turn_end:         (B, L) bool, the last sampled token of each turn sampled in this row
    token_rewards:    (B, L) float32, each turn's reward at its turn end, 0 elsewhere
    rollout_logprobs: (B, L) float32, the engine's log-prob of each sampled token, 0 elsewhere
    token_turn:       (B, L) long, turn index (0-based) of the sampled tokens of this row, -1 elsewhere
    action_token:     (B, L) bool, the sampled token where each turn chose its first executed action
                      (assembly.action_readout; none in a turn that executed no action or spelled it apart)
    group_ids:        (B,) long, group of the row's episode (same level within a group)
    episode_ids:      (B,) long, index of the row's episode in `episodes`, in [0, E)
    segment_ids:      (B,) long, position of the row among its episode's rows (turn order)
    episode_returns:  (B,) float32, the episode's return (sum of its turn rewards)
    success:          (B,) bool, whether the episode succeeded
    episodes:         list of E EpisodeRecord (per-turn replies, parses, actions, rewards, frames)
    view:             EpisodeView of the adv-masked tokens, built once here
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    vision: VisionInputs | None
    images_per_row: torch.Tensor
    loss_mask: torch.Tensor
    adv_mask: torch.Tensor
    turn_end: torch.Tensor
    token_rewards: torch.Tensor
    rollout_logprobs: torch.Tensor
    token_turn: torch.Tensor
    action_token: torch.Tensor
    group_ids: torch.Tensor
    episode_ids: torch.Tensor
    segment_ids: torch.Tensor
    episode_returns: torch.Tensor
    success: torch.Tensor
    episodes: list[EpisodeRecord]
    view: EpisodeView = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.view = EpisodeView.build(self.adv_mask, self.episode_ids, self.segment_ids)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _tensor_fields(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }

    def select(self, indices: list[int] | torch.Tensor) -> RolloutBatch:
        """The rows at `indices` (in that order), their images, and their episodes renumbered 0..E'-1."""
        rows = torch.as_tensor(indices, dtype=torch.long)
        picked: dict[str, Any] = {
            name: value[rows.to(value.device)] for name, value in self._tensor_fields().items()
        }
        vision = None
        if self.vision is not None:
            first_image = torch.cumsum(self.images_per_row, 0) - self.images_per_row
            images = [
                i
                for r in rows.tolist()
                for i in range(first_image[r], first_image[r] + self.images_per_row[r])
            ]
            vision = self.vision.select(images) if images else None
        old_episodes = list(dict.fromkeys(picked["episode_ids"].tolist()))
        renumber = {old: new for new, old in enumerate(old_episodes)}
        picked["episode_ids"] = torch.tensor(
            [renumber[e] for e in picked["episode_ids"].tolist()],
            dtype=torch.long,
            device=self.input_ids.device,
        )
        return RolloutBatch(vision=vision, episodes=[self.episodes[e] for e in old_episodes], **picked)

    def trim(self, length: int) -> RolloutBatch:
        """Every (B, L) field cut to its first `length` tokens (rows right-padded beyond their longest)."""
        width = self.input_ids.shape[1]
        cut = {name: v[:, :length] for name, v in self._tensor_fields().items() if v.shape[1:] == (width,)}
        return replace(self, **cut)

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {name: value.to(device) for name, value in self._tensor_fields().items()}
        vision = self.vision.to(device) if self.vision is not None else None
        return replace(self, vision=vision, **moved)

    def episode_outcomes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per episode (E,): group ids (long), returns (float32), success (bool)."""
        groups = torch.tensor([ep.group for ep in self.episodes], dtype=torch.long)
        returns = torch.tensor([ep.episode_return for ep in self.episodes], dtype=torch.float32)
        success = torch.tensor([ep.success for ep in self.episodes], dtype=torch.bool)
        return groups, returns, success


def build_batch(
    segments: list[list[Segment]], episodes: list[EpisodeRecord], pad_token_id: int
) -> RolloutBatch:
    """Collate each episode's segments (one list per episode, in turn order) into right-padded rows."""
    rows = [
        (e, s, segment)
        for e, episode_segments in enumerate(segments)
        for s, segment in enumerate(episode_segments)
    ]
    length = max(len(segment.token_ids) for _, _, segment in rows)

    def padded(values: list, pad, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values + [pad] * (length - len(values)), dtype=dtype)

    def stack(name: str, pad, dtype: torch.dtype) -> torch.Tensor:
        return torch.stack([padded(getattr(segment, name), pad, dtype) for _, _, segment in rows])  # (B, L)

    vision_parts = [v for _, _, segment in rows for v in segment.vision]
    episode_of_row = [e for e, _, _ in rows]
    return RolloutBatch(
        input_ids=stack("token_ids", pad_token_id, torch.long),
        attention_mask=torch.stack([padded([1] * len(seg.token_ids), 0, torch.long) for _, _, seg in rows]),
        vision=VisionInputs.cat(vision_parts) if vision_parts else None,
        images_per_row=torch.tensor([len(segment.images) for _, _, segment in rows], dtype=torch.long),
        loss_mask=stack("loss_mask", False, torch.bool),
        adv_mask=stack("adv_mask", False, torch.bool),
        turn_end=stack("turn_end", False, torch.bool),
        token_rewards=stack("rewards", 0.0, torch.float32),
        rollout_logprobs=stack("logprobs", 0.0, torch.float32),
        token_turn=stack("token_turn", -1, torch.long),
        action_token=stack("action_token", False, torch.bool),
        group_ids=torch.tensor([episodes[e].group for e in episode_of_row], dtype=torch.long),
        episode_ids=torch.tensor(episode_of_row, dtype=torch.long),
        segment_ids=torch.tensor([s for _, s, _ in rows], dtype=torch.long),
        episode_returns=torch.tensor(
            [episodes[e].episode_return for e in episode_of_row], dtype=torch.float32
        ),
        success=torch.tensor([episodes[e].success for e in episode_of_row], dtype=torch.bool),
        episodes=episodes,
    )
