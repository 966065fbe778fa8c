"""The privileged-state critic: it learns a value function of the text grid, fails clearly on an
oversized state, its checkpoint restores weights and optimizer moments exactly, and the trainer gives
every token of a turn that turn's state value."""

import numpy as np
import pytest
import torch
from test_rollout_batch import random_turns, synthetic_batch

from vagen.checkpoint import load_module_state, save_module_state
from vagen.critics import state_values
from vagen.critics.state import PAD_BYTE, FeatureCritic, StateCritic
from vagen.rollout.batch import TurnRecord


def grid_and_value(rng: torch.Generator) -> tuple[str, float]:
    """A 4x4 FrozenLake-like grid with P and G on random cells; V = 10 when G is in P's row, else 0."""
    cells = ["F"] * 16
    player, goal = torch.randperm(16, generator=rng)[:2].tolist()
    cells[player], cells[goal] = "P", "G"
    rows = ["".join(cells[r * 4 : r * 4 + 4]) for r in range(4)]
    return "\n".join(rows), 10.0 if player // 4 == goal // 4 else 0.0


def test_learns_a_value_of_the_grid_that_generalises_to_unseen_grids():
    torch.manual_seed(0)
    rng = torch.Generator().manual_seed(0)
    train = [grid_and_value(rng) for _ in range(512)]
    held_out = [grid_and_value(rng) for _ in range(256)]
    critic = StateCritic(max_bytes=32)
    assert torch.equal(critic([s for s, _ in held_out]), torch.zeros(256))  # V = 0 before any fit
    optim = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    states, targets = [s for s, _ in train], torch.tensor([v for _, v in train])
    for _ in range(300):
        optim.zero_grad()
        (0.5 * (critic(states) - targets).pow(2).mean()).backward()
        optim.step()
    held_targets = torch.tensor([v for _, v in held_out])
    with torch.no_grad():
        residual = critic([s for s, _ in held_out]) - held_targets
    explained = 1.0 - residual.var() / held_targets.var()
    assert explained > 0.9, explained


def test_feature_critic_learns_the_same_value_from_one_hot_planes():
    """FeatureCritic on the grids' one-hot planes (goal, player) fits the same held-out value."""

    def planes(grid: str) -> np.ndarray:
        cells = grid.replace("\n", "")
        return np.array([c == "G" for c in cells] + [c == "P" for c in cells], dtype=np.float32)

    torch.manual_seed(0)
    rng = torch.Generator().manual_seed(0)
    train = [grid_and_value(rng) for _ in range(512)]
    held_out = [grid_and_value(rng) for _ in range(256)]
    critic = FeatureCritic(in_features=32)
    optim = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    inputs, targets = critic.encode([planes(s) for s, _ in train]), torch.tensor([v for _, v in train])
    for _ in range(300):
        optim.zero_grad()
        (0.5 * (critic.values(inputs) - targets).pow(2).mean()).backward()
        optim.step()
    held_targets = torch.tensor([v for _, v in held_out])
    with torch.no_grad():
        residual = critic([planes(s) for s, _ in held_out]) - held_targets
    assert 1.0 - residual.var() / held_targets.var() > 0.9
    with pytest.raises(ValueError, match=r"state_features\(\) of 32 values on every turn, got None"):
        critic([planes(train[0][0]), None])


def test_padding_bytes_are_no_input_and_get_no_gradient():
    """Padding bytes embed to zero and stay zero through a fit, while real bytes learn. (With a learned
    padding vector, the ~1,900 constant inputs of a short grid made every Adam step shift the first
    layer's bias at random; the mpo Q-fit explained 0.8 of its targets instead of 0.95 -- round 10.)"""
    torch.manual_seed(0)
    critic = StateCritic(max_bytes=64, outputs=4)
    before = critic.embed.weight.detach().clone()
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    ids = critic.encode(["PFG\nHFF", "FPG\nHFF"])
    for _ in range(3):
        optimizer.zero_grad()
        (critic.values(ids) - torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 2.0]])).pow(2).sum().backward()
        optimizer.step()
    assert critic.embed.weight[PAD_BYTE].abs().sum() == 0
    assert not torch.equal(critic.embed.weight[ord("P")], before[ord("P")])


def test_a_state_longer_than_max_bytes_is_a_clear_error():
    with pytest.raises(ValueError, match="exceeds algo.state_critic_max_bytes=4"):
        StateCritic(max_bytes=4)(["PFFFF"])


def test_checkpoint_restores_weights_and_adam_moments(tmp_path):
    torch.manual_seed(0)
    states, targets = ["PFG", "FPG", "GFP"], torch.tensor([1.0, 2.0, 3.0])

    def step(critic, optim):
        optim.zero_grad()
        (critic(states) - targets).pow(2).mean().backward()
        optim.step()

    critic = StateCritic(max_bytes=8)
    optim = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    step(critic, optim)
    save_module_state(tmp_path / "state_critic", critic, optim)
    step(critic, optim)  # the original moves on

    restored = StateCritic(max_bytes=8)
    restored_optim = torch.optim.AdamW(restored.parameters(), lr=1e-2)
    load_module_state(tmp_path / "state_critic", restored, restored_optim)
    step(restored, restored_optim)  # the restored copy takes the same second step
    for a, b in zip(critic.parameters(), restored.parameters(), strict=True):
        assert torch.allclose(a, b, atol=0, rtol=0)
    with pytest.raises(FileNotFoundError, match="written without this module"):
        load_module_state(tmp_path / "nope", restored, restored_optim)


def test_state_values_give_each_token_its_turns_state_value_across_window_segments():
    # Episode 0 was split into two rows (listed second-segment first); episode 1 has one row.
    mask, turn_end = random_turns(3, 10, seed=3)
    batch = synthetic_batch(mask, turn_end, torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]))
    turns = {0: int(turn_end[0].sum() + turn_end[2].sum()), 1: int(turn_end[1].sum())}
    for e, episode in enumerate(batch.episodes):
        episode.turns = [turn_with_state(f"{e}.{t}") for t in range(turns[e])]

    def critic(states: list[str]) -> torch.Tensor:  # V("e.t") = 10 e + t
        return torch.tensor([10.0 * int(s.split(".")[0]) + int(s.split(".")[1]) for s in states])

    critic.reads = "state"  # the TurnRecord field it reads, as StateCritic.reads

    values = state_values(critic, batch)
    # Reference: count the turn ends before each token in the episode's segment order.
    for rows, e in (((2, 0), 0), ((1,), 1)):
        ends_before = 0
        for row in rows:
            for i in range(mask.shape[1]):
                expected = 10.0 * e + ends_before if mask[row, i] else 0.0
                assert values[row, i].item() == expected, (row, i)
                ends_before += int(turn_end[row, i])
    # one state per turn end, or a clear error
    batch.episodes[1].turns.pop()
    with pytest.raises(RuntimeError, match="turn ends per episode"):
        state_values(critic, batch)


def turn_with_state(state: str) -> TurnRecord:
    return TurnRecord(
        observation="", frame=None, reply="", finish_reason="stop", num_tokens=1, format_ok=True,
        actions=[], num_invalid=0, env_reward=0.0, reasoning_reward=0.0, grounding=None, worldmodel=None,
        reward=0.0, state=state,
    )  # fmt: skip
