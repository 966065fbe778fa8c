"""Critics: the privileged state critics (MLPs on the env's true state) and the fitting of every critic."""

from vagen.critics.fit import (
    fit_state_critic,
    model_critic_loss,
    return_regression,
    state_values,
    turn_states,
)
from vagen.critics.state import (
    STATE_CRITICS,
    FeatureCritic,
    StateCritic,
    TurnCritic,
    build_state_critic,
)

__all__ = [
    "STATE_CRITICS",
    "FeatureCritic",
    "StateCritic",
    "TurnCritic",
    "build_state_critic",
    "fit_state_critic",
    "model_critic_loss",
    "return_regression",
    "state_values",
    "turn_states",
]
