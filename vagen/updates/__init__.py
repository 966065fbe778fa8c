"""Policy updates by name (`algo.policy_loss`). Each entry declares what it needs (its critic, the action
tokens' log-probs at scoring, config requirements) and provides its preparation and its loss; the
trainer calls the entry and never compares names. Adding an update is one class implementing
vagen.updates.base.PolicyUpdate, one test and one line here.
"""

from vagen.updates.base import Plan, PolicyUpdate, actor_loss
from vagen.updates.mpo import MPOUpdate
from vagen.updates.ppo import PPOUpdate

POLICY_UPDATES: dict[str, PolicyUpdate] = {
    "ppo": PPOUpdate(),
    "mpo": MPOUpdate(),
}

__all__ = ["POLICY_UPDATES", "Plan", "PolicyUpdate", "actor_loss"]
