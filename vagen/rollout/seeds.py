"""Level and dynamics seeds: disjoint train/validation ranges, per-member RNG streams.

A group shares one level seed (the initial state); each member gets its own dynamics seed (slippery
ice), derived with numpy's SeedSequence from (base seed, level seed, member) -- stable across
processes and Python versions, unlike `hash()`.

Held-out layouts: small games repeat maps (4x4 FrozenLake: ~750 distinct layouts in 2,000 seeds), so
distinct seeds do not make unseen levels. With a `layout_of(seed) -> str` function (the env's
`layout_key` after `reset(seed)`), validation levels are the first seeds of the validation range with
pairwise distinct layouts, and training skips every seed whose layout is among the first
`num_val_layouts` of them -- so no training level ever shows a validation map.
"""

from collections.abc import Callable
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
    """Issues level seeds: training levels advance a counter, validation levels are a fixed list.

    Without `layout_of`:
      train levels: train_start + k for k = 0, 1, 2, ... (never reaching val_start)
      val levels:   val_start + i for i = 0 .. N-1 (the same every evaluation)
    With `layout_of` (held-out layouts, see the module docstring):
      val levels:   the first N seeds >= val_start whose layouts are pairwise distinct (N <= num_val_layouts)
      train levels: the seeds >= train_start in order, skipping those with a held-out layout;
                    `train_levels_used` counts levels issued, so a checkpoint restores the same stream.
    """

    def __init__(
        self,
        base_seed: int,
        train_start: int,
        val_start: int,
        layout_of: Callable[[int], str] | None = None,
        num_val_layouts: int = 512,
    ) -> None:
        if train_start >= val_start:
            raise ValueError(
                f"training seeds ({train_start}..) must lie below validation seeds ({val_start}..)"
            )
        self.base_seed = base_seed
        self.train_start = train_start
        self.val_start = val_start
        self.layout_of = layout_of
        self.num_val_layouts = num_val_layouts
        self.train_levels_used = 0
        self._held_out: tuple[list[int], set[str]] | None = None  # validation seeds, their layouts
        self._train_levels: list[int] = []  # training seeds issued or scanned so far, in order
        self._next_seed = train_start  # first training seed not yet scanned

    def next_train(self, num_groups: int, group_size: int) -> list[EpisodeSeeds]:
        """Seeds for `num_groups` new training levels x `group_size` members; advances the counter."""
        levels = self._train_range(self.train_levels_used, self.train_levels_used + num_groups)
        self.train_levels_used += num_groups
        return self.episodes(levels, group_size)

    def validation(self, num_groups: int, group_size: int) -> list[EpisodeSeeds]:
        """Seeds for the first `num_groups` validation levels x `group_size` members (fixed)."""
        if self.layout_of is None:
            return self.episodes(range(self.val_start, self.val_start + num_groups), group_size)
        if num_groups > self.num_val_layouts:
            raise ValueError(
                f"{num_groups} validation levels asked for, but only {self.num_val_layouts} layouts are held "
                "out of training (raise rollout.num_val_layouts)"
            )
        return self.episodes(self.held_out()[0][:num_groups], group_size)

    def held_out(self) -> tuple[list[int], set[str]]:
        """The `num_val_layouts` validation seeds with pairwise distinct layouts, and those layouts
        (computed once; needs `layout_of`)."""
        if self._held_out is None:
            layouts: dict[str, int] = {}
            seed = self.val_start
            while len(layouts) < self.num_val_layouts:
                if seed - self.val_start > 1000 * self.num_val_layouts:
                    raise RuntimeError(
                        f"found only {len(layouts)} distinct validation layouts in "
                        f"{seed - self.val_start} seeds; lower rollout.num_val_layouts"
                    )
                layouts.setdefault(self.layout_of(seed), seed)
                seed += 1
            self._held_out = list(layouts.values()), set(layouts)
        return self._held_out

    def _train_range(self, first: int, end: int) -> list[int]:
        """Training levels number first .. end - 1 (scanning seeds and skipping held-out layouts)."""
        held_out = set() if self.layout_of is None else self.held_out()[1]
        while len(self._train_levels) < end:
            if self._next_seed >= self.val_start:
                raise RuntimeError("training level seeds exhausted: they would enter the validation range")
            seed, self._next_seed = self._next_seed, self._next_seed + 1
            if not held_out or self.layout_of(seed) not in held_out:
                self._train_levels.append(seed)
        return self._train_levels[first:end]

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
