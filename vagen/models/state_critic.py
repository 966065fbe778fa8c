"""A privileged-state critic: V(s) read from the env's text state, not from the policy's tokens.

In simulation the trainer knows the true state of every turn (the text grid that GiGPO already uses as
its anchor key), while the policy acts from images. A small MLP on that state can learn the current
policy's values long before a value head on a vision-language backbone has learned to see
("asymmetric actor-critic", Pinto et al. 2018). Turn-level estimators (turn_gae, bilevel_gae) take its
V(s_t) as the value of every token of turn t. The policy never reads the state.

The state string is read as UTF-8 bytes at fixed positions (a grid keeps each cell at the same offset):
byte embedding -> flatten -> MLP -> V. The last layer starts at zero, so V = 0 before any fit.
"""

from __future__ import annotations

import torch
from torch import nn

PAD_BYTE = 256  # one past the byte values


class StateCritic(nn.Module):
    """V(s) for a list of state strings of at most `max_bytes` UTF-8 bytes each."""

    def __init__(self, max_bytes: int = 256, embed_dim: int = 8, hidden: int = 256) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.embed = nn.Embedding(PAD_BYTE + 1, embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(max_bytes * embed_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def encode(self, states: list[str]) -> torch.Tensor:
        """(N, max_bytes) long: each state's bytes, padded with PAD_BYTE."""
        ids = torch.full((len(states), self.max_bytes), PAD_BYTE, dtype=torch.long)
        for i, state in enumerate(states):
            raw = state.encode("utf-8")
            if len(raw) > self.max_bytes:
                raise ValueError(
                    f"state of {len(raw)} bytes exceeds algo.state_critic_max_bytes={self.max_bytes}: "
                    f"{state[:60]!r}..."
                )
            ids[i, : len(raw)] = torch.tensor(list(raw), dtype=torch.long)
        return ids.to(self.embed.weight.device)

    def values(self, ids: torch.Tensor) -> torch.Tensor:
        """(N,) float32 values of encoded states (N, max_bytes): encode once, evaluate many times."""
        return self.mlp(self.embed(ids).flatten(1)).squeeze(-1)  # embed: (N, max_bytes, embed_dim)

    def forward(self, states: list[str]) -> torch.Tensor:
        """(N,) float32 values."""
        return self.values(self.encode(states))
