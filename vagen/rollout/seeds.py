"""Level and dynamics seeds: disjoint train/validation ranges, per-member RNG streams.

A group shares one level seed (the initial state); each member gets its own dynamics seed (slippery
ice), derived with numpy's SeedSequence from (base seed, level seed, member) -- stable across
processes and Python versions, unlike `hash()`.

Held-out layouts: small games repeat maps (4x4 FrozenLake: ~750 distinct layouts in 2,000 seeds), so
distinct seeds do not make unseen levels. With a `layout_of(seed) -> str` function (the env's
`layout_key` after `reset(seed)`), the layouts are split by a hash: a layout is held out when
sha256(layout) read as a fraction of 2^64 lies below `val_layout_share`. Validation levels are the
seeds of the validation range whose layout is held out, training skips them -- so no training level
ever shows a validation map, and both sides draw their maps from the generator's own distribution.
(Holding out the first layouts met instead would hold out the most frequent ones: on 4x4 FrozenLake,
512 of them are every map with at most 2 holes, which training would then never see.)
"""

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TRAIN_SEED_START = 0  # training level seeds count up from here ...
VAL_SEED_START = 10**9  # ... and never reach the validation ones
VAL_LAYOUT_SHARE = 0.2  # share of the layouts held out for validation


def is_held_out(layout: str, share: float) -> bool:
    """Whether a layout belongs to validation: a uniform hash of the layout text, below `share`."""
    return int.from_bytes(hashlib.sha256(layout.encode()).digest()[:8], "big") < share * 2**64


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
      val levels:   the first N seeds >= val_start whose layout is held out
      train levels: the seeds >= train_start in order, skipping those with a held-out layout;
                    `train_levels_used` counts levels issued, so a checkpoint restores the same stream.
    """

    def __init__(
        self,
        base_seed: int,
        train_start: int = TRAIN_SEED_START,
        val_start: int = VAL_SEED_START,
        layout_of: Callable[[int], str] | None = None,
        val_layout_share: float = VAL_LAYOUT_SHARE,
    ) -> None:
        if train_start >= val_start:
            raise ValueError(
                f"training seeds ({train_start}..) must lie below validation seeds ({val_start}..)"
            )
        if not 0.0 < val_layout_share < 1.0:
            raise ValueError(f"val_layout_share must lie in (0, 1), got {val_layout_share}")
        self.base_seed = base_seed
        self.train_start = train_start
        self.val_start = val_start
        self.layout_of = layout_of
        self.val_layout_share = val_layout_share
        self.train_levels_used = 0
        self._val_levels: list[int] = []  # validation seeds found so far, in order
        self._next_val_seed = val_start  # first validation seed not yet scanned
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
        while len(self._val_levels) < num_groups:
            if self._next_val_seed - self.val_start > 1000 * num_groups:
                raise RuntimeError(
                    f"found only {len(self._val_levels)} held-out levels in {1000 * num_groups} seeds: "
                    "does the env have so few layouts?"
                )
            seed, self._next_val_seed = self._next_val_seed, self._next_val_seed + 1
            if self.held_out(seed):
                self._val_levels.append(seed)
        return self.episodes(self._val_levels[:num_groups], group_size)

    def held_out(self, seed: int) -> bool:
        """Whether the level of `seed` has a validation layout (needs `layout_of`)."""
        return is_held_out(self.layout_of(seed), self.val_layout_share)

    def _train_range(self, first: int, end: int) -> list[int]:
        """Training levels number first .. end - 1 (scanning seeds and skipping held-out layouts)."""
        while len(self._train_levels) < end:
            if self._next_seed >= self.val_start:
                raise RuntimeError("training level seeds exhausted: they would enter the validation range")
            seed, self._next_seed = self._next_seed, self._next_seed + 1
            if self.layout_of is None or not self.held_out(seed):
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
