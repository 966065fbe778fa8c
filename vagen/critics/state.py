"""The privileged-state critics: V(s) (or Q(s, .)) read from the env's true state, not the policy's tokens.

In simulation the trainer knows the true state of every turn (the text grid that GiGPO already uses as
its anchor key), while the policy acts from images. A small MLP on that state can learn the current
policy's values long before a value head on a vision-language backbone has learned to see
("asymmetric actor-critic", Pinto et al. 2018). Turn-level estimators (turn_gae, bilevel_gae) take its
V(s_t) as the value of every token of turn t. The policy never reads the state.

StateCritic reads the state string as UTF-8 bytes at fixed positions (a grid keeps each cell at the
same offset): byte embedding -> flatten -> MLP -> V (or Q(s, .) of every action); its last layer starts
at zero, so the values are 0 before any fit. FeatureCritic reads the env's one-hot state vector
(`state_features()`: a plane per tile kind and one for the player, or FrozenLake's egocentric view,
the map seen from the player: `env_kwargs.state_view=egocentric`) with the same MLP and default
initialisation (algo.state_critic_input=features). Each names the TurnRecord field it reads (`reads`),
so the trainer hands every critic its own input without asking the config; `build_state_critic` picks
one by `algo.state_critic_input` from STATE_CRITICS.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

PAD_BYTE = 256  # one past the byte values


def value_mlp(in_features: int, hidden: int, outputs: int) -> nn.Sequential:
    """in_features -> hidden -> hidden -> outputs, ReLU between: the body of both critics."""
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, outputs),
    )


class TurnCritic(nn.Module):
    """What both critics share: `reads` names the TurnRecord field a turn's input is read from; each
    subclass's `encode` (once per fit) turns a list of those inputs into a tensor and its `values` (every
    step) maps that through `head` to (N,) values, or (N, K) Q-values with `outputs` K > 1."""

    reads: str

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.outputs = outputs

    def head(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mlp(x)  # (N, K)
        return out.squeeze(-1) if self.outputs == 1 else out

    def forward(self, states: list) -> torch.Tensor:
        """(N,) float32 values, or (N, K)."""
        return self.values(self.encode(states))


class StateCritic(TurnCritic):
    """V(s) for a list of state strings of at most `max_bytes` UTF-8 bytes each; with `outputs` K > 1,
    Q(s, a) of K actions instead (the mpo policy loss)."""

    reads = "state"  # TurnRecord.state: the env's text grid

    def __init__(self, max_bytes: int = 256, embed_dim: int = 8, hidden: int = 256, outputs: int = 1) -> None:
        super().__init__(outputs)
        self.max_bytes = max_bytes
        self.embed = nn.Embedding(PAD_BYTE + 1, embed_dim, padding_idx=PAD_BYTE)
        self.mlp = value_mlp(max_bytes * embed_dim, hidden, outputs)
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
        """(N,) float32 values of encoded states (N, max_bytes), (N, K) with K outputs: encode once,
        evaluate many times."""
        return self.head(self.embed(ids).flatten(1))  # embed: (N, max_bytes, embed_dim)


class FeatureCritic(TurnCritic):
    """V(s) (or Q(s, .) with `outputs` K > 1) for a list of float state vectors of `in_features` each."""

    reads = "features"  # TurnRecord.features: the env's state_features()

    def __init__(self, in_features: int, hidden: int = 256, outputs: int = 1) -> None:
        super().__init__(outputs)
        self.in_features = in_features
        self.mlp = value_mlp(in_features, hidden, outputs)

    def encode(self, states: list[np.ndarray | None]) -> torch.Tensor:
        """(N, in_features) float32: the vectors stacked."""
        for state in states:
            if state is None or state.shape != (self.in_features,):
                raise ValueError(
                    "algo.state_critic_input=features needs the env's state_features() of "
                    f"{self.in_features} values on every turn, got {None if state is None else state.shape}"
                )
        device = self.mlp[0].weight.device
        if not states:
            return torch.zeros(0, self.in_features, device=device)
        return torch.from_numpy(np.stack(states)).float().to(device)

    def values(self, encoded: torch.Tensor) -> torch.Tensor:
        """(N,) float32 values of encoded states (N, in_features), (N, K) with K outputs."""
        return self.head(encoded)


def _text_critic(max_bytes: int, probe_features: np.ndarray | None, outputs: int) -> TurnCritic:
    return StateCritic(max_bytes, outputs=outputs)


def _feature_critic(max_bytes: int, probe_features: np.ndarray | None, outputs: int) -> TurnCritic:
    if probe_features is None:
        raise ValueError("algo.state_critic_input=features: the env has no state_features()")
    return FeatureCritic(len(probe_features), outputs=outputs)


# algo.state_critic_input -> builder(max_bytes, a state_features() vector of the env or None, outputs)
STATE_CRITICS = {"text": _text_critic, "features": _feature_critic}


def build_state_critic(
    state_input: str, max_bytes: int, probe_features: np.ndarray | None, outputs: int
) -> TurnCritic:
    """The critic reading `state_input` with `outputs` values per state (1: V(s); K: Q(s, .) of K actions)."""
    return STATE_CRITICS[state_input](max_bytes, probe_features, outputs)
