"""Level and dynamics seeds: disjoint train/validation ranges, per-member RNG streams.

A group shares one level seed (the initial state); each member gets its own dynamics seed (slippery
ice), derived with numpy's SeedSequence from (base seed, level seed, member) -- stable across
processes and Python versions, unlike `hash()`.
"""

from dataclasses import dataclass

import numpy as np


def derive_seed(*entropy: int) -> int:
    """A 32-bit seed derived deterministically from integers (numpy SeedSequence)."""
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(1)[0])


@dataclass
class EpisodeSeeds:
    """Seeds of one episode: `level` fixes the initial state, `dynamics` the env's randomness."""

    level: int
    dynamics: int
    group: int
    member: int


class SeedSchedule:
    """Issues level seeds: training levels advance a counter, validation levels are a fixed range.

    train levels: train_start + k for k = 0, 1, 2, ... (never reaching val_start)
    val levels:   val_start + i for i = 0 .. N-1 (the same every evaluation)
    """

    def __init__(self, base_seed: int, train_start: int, val_start: int) -> None:
        if train_start >= val_start:
            raise ValueError(
                f"training seeds ({train_start}..) must lie below validation seeds ({val_start}..)"
            )
        self.base_seed = base_seed
        self.train_start = train_start
        self.val_start = val_start
        self.train_levels_used = 0

    def next_train(self, num_groups: int, group_size: int) -> list[EpisodeSeeds]:
        """Seeds for `num_groups` new training levels x `group_size` members; advances the counter."""
        first = self.train_start + self.train_levels_used
        if first + num_groups > self.val_start:
            raise RuntimeError("training level seeds exhausted: they would enter the validation range")
        self.train_levels_used += num_groups
        return self.episodes(range(first, first + num_groups), group_size)

    def validation(self, num_groups: int, group_size: int) -> list[EpisodeSeeds]:
        """Seeds for the first `num_groups` validation levels x `group_size` members (fixed)."""
        return self.episodes(range(self.val_start, self.val_start + num_groups), group_size)

    def episodes(self, levels: range | list[int], group_size: int) -> list[EpisodeSeeds]:
        """Group-major episode seeds; member dynamics = SeedSequence(base, level, member)."""
        return [
            EpisodeSeeds(
                level=level, dynamics=derive_seed(self.base_seed, level, member), group=g, member=member
            )
            for g, level in enumerate(levels)
            for member in range(group_size)
        ]

    def state_dict(self) -> dict[str, int]:
        return {"train_levels_used": self.train_levels_used}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.train_levels_used = int(state["train_levels_used"])
