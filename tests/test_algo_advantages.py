"""Advantage estimators against numbers worked out by hand from the formulas in their docstrings."""

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vagen.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    bilevel_gae,
    broadcast,
    broadcast_turns,
    gather_turns,
    gigpo,
    grpo,
    masked_gae,
    rloo,
    turn_gae,
    turn_index,
    whiten,
)

X = 123.0  # a value at an unmasked position: must be ignored


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def b(values):
    return torch.tensor(values, dtype=torch.bool)


def assert_close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --- masked GAE -------------------------------------------------------------------------------

# Row 0: masked positions 1, 2, 4 (gaps at 0, 3, 5). gamma = 0.9, lam = 0.8, gamma * lam = 0.72.
#   p=4: delta = 1 + 0 - 3 = -2                       A = -2
#   p=2: delta = 0.5 + 0.9*3 - 2 = 1.2                A = 1.2 + 0.72*(-2) = -0.24
#   p=1: delta = 0 + 0.9*2 - 1 = 0.8                  A = 0.8 + 0.72*(-0.24) = 0.6272
# Row 1: masked 0..3, reward 2 at position 3.
#   p=3: delta = 2 - 1 = 1                            A = 1
#   p=2: delta = 0.9*1 - 1.5 = -0.6                   A = -0.6 + 0.72 = 0.12
#   p=1: delta = 0.9*1.5 - 1 = 0.35                   A = 0.35 + 0.72*0.12 = 0.4364
#   p=0: delta = 0.9*1 - 0.5 = 0.4                    A = 0.4 + 0.72*0.4364 = 0.714208
# Row 2: empty mask.
GAE_REWARDS = [[X, 0.0, 0.5, X, 1.0, X], [0.0, 0.0, 0.0, 2.0, X, X], [X] * 6]
GAE_VALUES = [[X, 1.0, 2.0, X, 3.0, X], [0.5, 1.0, 1.5, 1.0, X, X], [X] * 6]
GAE_MASK = [[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0], [0] * 6]
GAE_ADVANTAGES = [[0, 0.6272, -0.24, 0, -2.0, 0], [0.714208, 0.4364, 0.12, 1.0, 0, 0], [0] * 6]
GAE_RETURNS = [[0, 1.6272, 1.76, 0, 1.0, 0], [1.214208, 1.4364, 1.62, 2.0, 0, 0], [0] * 6]


def test_masked_gae_hand_computed():
    advantages, returns = masked_gae(t(GAE_REWARDS), t(GAE_VALUES), b(GAE_MASK), gamma=0.9, lam=0.8)
    assert_close(advantages, GAE_ADVANTAGES)
    assert_close(returns, GAE_RETURNS)


def test_masked_gae_ignores_nan_outside_mask():
    rewards = t(GAE_REWARDS).masked_fill(~b(GAE_MASK), math.nan)
    values = t(GAE_VALUES).masked_fill(~b(GAE_MASK), math.inf)
    advantages, returns = masked_gae(rewards, values, b(GAE_MASK), gamma=0.9, lam=0.8)
    assert_close(advantages, GAE_ADVANTAGES)
    assert_close(returns, GAE_RETURNS)


def test_masked_gae_dtypes():
    """bf16 inputs are computed and returned in float32; float64 stays float64."""
    rewards, values, mask = t(GAE_REWARDS), t(GAE_VALUES), b(GAE_MASK)
    bf16_adv, bf16_ret = masked_gae(rewards.bfloat16(), values.bfloat16(), mask, 0.9, 0.8)
    assert bf16_adv.dtype == bf16_ret.dtype == torch.float32
    # the hand-picked numbers are exact in bf16, so the results match the fp32 ones
    assert_close(bf16_adv, GAE_ADVANTAGES)
    f64_adv, _ = masked_gae(rewards.double(), values.double(), mask, 0.9, 0.8)
    assert f64_adv.dtype == torch.float64
    assert_close(f64_adv, GAE_ADVANTAGES, atol=1e-12)


def reference_gae(rewards, values, mask, gamma, lam):
    """Plain python: walk the masked positions of one row backwards."""
    positions = [i for i, m in enumerate(mask) if m]
    advantages = [0.0] * len(mask)
    next_value, next_adv = 0.0, 0.0
    for p in reversed(positions):
        delta = rewards[p] + gamma * next_value - values[p]
        next_adv = delta + gamma * lam * next_adv
        advantages[p] = next_adv
        next_value = values[p]
    return advantages


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    length=st.integers(1, 12),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_masked_gae_matches_python_loop(seed, batch, length, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, length, generator=gen) < 0.6
    advantages, _ = masked_gae(rewards, values, mask, gamma, lam)
    for row in range(batch):
        expected = reference_gae(rewards[row].tolist(), values[row].tolist(), mask[row].tolist(), gamma, lam)
        assert advantages[row].tolist() == pytest.approx(expected, abs=1e-9)


def test_masked_gae_huge_rewards_stay_finite():
    rewards = t([[0.0, 1e30, -1e30, 1e30]])
    values = t([[1e30, 0.0, 1e30, -1e30]])
    advantages, returns = masked_gae(rewards, values, b([[1, 1, 1, 1]]), 1.0, 1.0)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="one shape"):
        masked_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), 1.0, 1.0)


# --- turn layout helpers ----------------------------------------------------------------------

# Row 0: turn 1 = tokens 1, 2 (e_1 = 2); tokens 3, 4 observation; turn 2 = tokens 5, 6 (e_2 = 6).
# Row 1: turn 1 = 0, 1 (e_1 = 1); 2 obs; turn 2 = 3, 5 with a gap at 4 (e_2 = 5); 6 obs;
#        turn 3 = 7 (e_3 = 7); token 8 masked but after the last turn end.
TURN_MASK = [[0, 1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 0, 1, 0, 1, 0, 1, 1]]
TURN_END = [[0, 0, 1, 0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 1, 0, 1, 0]]
TURN_REWARDS = [[X, 0.0, 1.0, X, X, 0.3, 2.0, X, X], [0.0, 0.5, X, 0.2, 9.0, 0.0, X, 1.0, 5.0]]
TURN_VALUES = [[X, 0.1, 0.5, X, X, 0.2, 1.0, X, X], [0.3, 0.4, X, 0.6, 100.0, 0.8, X, 0.5, 7.0]]


def test_turn_index_counts_turn_ends_strictly_before():
    assert turn_index(b(TURN_END)).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 2], [0, 0, 1, 1, 1, 1, 2, 2, 3]]


def test_gather_and_broadcast_turns():
    turn_values, turn_mask = gather_turns(t(TURN_REWARDS), b(TURN_END))
    assert_close(turn_values, [[1.0, 2.0, 0.0], [0.5, 0.0, 1.0]])
    assert turn_mask.tolist() == [[True, True, False], [True, True, True]]
    spread = broadcast_turns(t([[10.0, 20.0, 0.0], [1.0, 2.0, 3.0]]), b(TURN_END), b(TURN_MASK))
    assert_close(spread, [[0, 10, 10, 0, 0, 20, 20, 0, 0], [1, 1, 0, 2, 0, 2, 0, 3, 0]])


def test_broadcast_turns_rejects_too_few_columns():
    with pytest.raises(ValueError, match="more turns"):
        broadcast_turns(t([[1.0], [1.0]]), b(TURN_END), b(TURN_MASK))


# --- turn GAE and bi-level GAE ----------------------------------------------------------------

# Turn level, gamma_turn = 0.5, lam_turn = 0.5 (gamma * lam = 0.25):
# Row 0: e_2: delta = 2 - 1 = 1                         A_2 = 1
#        e_1: delta = 1 + 0.5*1.0 - 0.5 = 1             A_1 = 1 + 0.25*1 = 1.25
# Row 1: e_3: delta = 1 - 0.5 = 0.5                     A_3 = 0.5
#        e_2: delta = 0 + 0.5*0.5 - 0.8 = -0.55         A_2 = -0.55 + 0.25*0.5 = -0.425
#        e_1: delta = 0.5 + 0.5*0.8 - 0.4 = 0.5         A_1 = 0.5 + 0.25*(-0.425) = 0.39375
TURN_GAE_ADVANTAGES = [
    [0, 1.25, 1.25, 0, 0, 1.0, 1.0, 0, 0],
    [0.39375, 0.39375, 0, -0.425, 0, -0.425, 0, 0.5, 0],
]
# Token level, gamma_token = 0.9, lam_token = 0.8 (0.72), from A(e_t) = A_t backwards:
# Row 0: token 5: delta = 0.3 + 0.9*1.0 - 0.2 = 1.0      A = 1.0 + 0.72*1.0 = 1.72
#        token 1: delta = 0 + 0.9*0.5 - 0.1 = 0.35       A = 0.35 + 0.72*1.25 = 1.25
# Row 1: token 3: delta = 0.2 + 0.9*0.8 - 0.6 = 0.32     A = 0.32 + 0.72*(-0.425) = 0.014
#        token 0: delta = 0 + 0.9*0.4 - 0.3 = 0.06       A = 0.06 + 0.72*0.39375 = 0.3435
#        token 8: after the last turn end -> 0
BILEVEL_ADVANTAGES = [
    [0, 1.25, 1.25, 0, 0, 1.72, 1.0, 0, 0],
    [0.3435, 0.39375, 0, 0.014, 0, -0.425, 0, 0.5, 0],
]
BILEVEL_RETURNS = [
    [0, 1.35, 1.75, 0, 0, 1.92, 2.0, 0, 0],
    [0.6435, 0.79375, 0, 0.614, 0, 0.375, 0, 1.0, 0],
]


def test_turn_gae_hand_computed():
    advantages, returns = turn_gae(
        t(TURN_REWARDS), t(TURN_VALUES), b(TURN_MASK), b(TURN_END), gamma=0.5, lam=0.5
    )
    assert_close(advantages, TURN_GAE_ADVANTAGES)
    expected_returns = [
        [0, 1.35, 1.75, 0, 0, 1.2, 2.0, 0, 0],
        [0.69375, 0.79375, 0, 0.175, 0, 0.375, 0, 1.0, 0],
    ]
    assert_close(returns, expected_returns)


def test_bilevel_gae_hand_computed():
    advantages, returns = bilevel_gae(
        t(TURN_REWARDS), t(TURN_VALUES), b(TURN_MASK), b(TURN_END), 0.5, 0.5, 0.9, 0.8
    )
    assert_close(advantages, BILEVEL_ADVANTAGES)
    assert_close(returns, BILEVEL_RETURNS)


def test_bilevel_gae_bf16_inputs_give_float32():
    advantages, returns = bilevel_gae(
        t(TURN_REWARDS).bfloat16(), t(TURN_VALUES).bfloat16(), b(TURN_MASK), b(TURN_END), 0.5, 0.5, 0.9, 0.8
    )
    assert advantages.dtype == returns.dtype == torch.float32
    assert_close(advantages, BILEVEL_ADVANTAGES, atol=2e-2)  # 0.3, 0.2, 0.1 ... are rounded in bf16


def test_one_turn_and_empty_rows():
    """A single one-token turn, and a row with nothing masked."""
    rewards, values = t([[X, 3.0, X], [X, X, X]]), t([[X, 1.0, X], [X, X, X]])
    mask, turn_end = b([[0, 1, 0], [0, 0, 0]]), b([[0, 1, 0], [0, 0, 0]])
    for advantages, returns in (
        bilevel_gae(rewards, values, mask, turn_end, 0.9, 0.9, 0.9, 0.9),
        turn_gae(rewards, values, mask, turn_end, 0.9, 0.9),
        masked_gae(rewards, values, mask, 0.9, 0.9),
    ):
        assert_close(advantages, [[0, 2.0, 0], [0, 0, 0]])
        assert_close(returns, [[0, 3.0, 0], [0, 0, 0]])


def test_turn_end_outside_mask_is_an_error():
    with pytest.raises(ValueError, match="turn-end"):
        bilevel_gae(t([[0.0, 1.0]]), t([[0.0, 0.0]]), b([[1, 0]]), b([[0, 1]]), 1.0, 1.0, 1.0, 1.0)


def _random_turns(gen, batch, length, max_turns):
    """Masks with gaps and up to max_turns turns per row; every turn end is masked."""
    mask = torch.rand(batch, length, generator=gen) < 0.7
    turn_end = torch.zeros(batch, length, dtype=torch.bool)
    for row in range(batch):
        positions = mask[row].nonzero().flatten()
        if len(positions) == 0:
            continue
        num_turns = int(torch.randint(1, max_turns + 1, (1,), generator=gen))
        ends = positions[torch.randperm(len(positions), generator=gen)[:num_turns]]
        turn_end[row, ends] = True
        turn_end[row, positions[-1]] = True  # no dangling tokens after the last turn
    return mask, turn_end


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), length=st.integers(1, 10))
def test_bilevel_equals_masked_gae_for_one_turn_with_unit_gamma_lambda(seed, batch, length):
    """gamma = lam = 1, no per-token rewards, one turn: both are R - V(i) for every token."""
    gen = torch.Generator().manual_seed(seed)
    mask, turn_end = _random_turns(gen, batch, length, max_turns=1)
    values = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    rewards = torch.where(turn_end, torch.randn(batch, length, generator=gen, dtype=torch.float64), 0.0)
    expected = masked_gae(rewards, values, mask, 1.0, 1.0)
    actual = bilevel_gae(rewards, values, mask, turn_end, 1.0, 1.0, 1.0, 1.0)
    torch.testing.assert_close(actual, expected)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 3),
    length=st.integers(1, 12),
    gamma_turn=st.floats(0.0, 1.0),
    lam_turn=st.floats(0.0, 1.0),
)
def test_bilevel_token_level_with_unit_gamma_lambda(seed, batch, length, gamma_turn, lam_turn):
    """gamma_token = lam_token = 1, no per-token rewards: token i of turn t gets A_t + V(e_t) - V(i)."""
    gen = torch.Generator().manual_seed(seed)
    mask, turn_end = _random_turns(gen, batch, length, max_turns=3)
    values = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    rewards = torch.where(turn_end, torch.randn(batch, length, generator=gen, dtype=torch.float64), 0.0)
    advantages, _ = bilevel_gae(rewards, values, mask, turn_end, gamma_turn, lam_turn, 1.0, 1.0)
    turn_advantages, _ = turn_gae(rewards, values, mask, turn_end, gamma_turn, lam_turn)  # A_t per token
    end_values, _ = gather_turns(values, turn_end)
    expected = turn_advantages + broadcast_turns(end_values, turn_end, mask) - values
    torch.testing.assert_close(advantages, torch.where(mask, expected, 0.0))


# --- group estimators -------------------------------------------------------------------------

# groups (ids deliberately unordered): 7 -> [1, 2, 3]; 2 -> [4] (one member); 5 -> [5, 5] (equal);
# 0 -> [0, 10]
GROUP_RETURNS = [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 0.0, 10.0]
GROUP_IDS = [7, 7, 7, 2, 5, 5, 0, 0]


def test_grpo_hand_computed():
    returns, ids = t(GROUP_RETURNS), torch.tensor(GROUP_IDS)
    # group 7: mean 2, unbiased std 1; group 0: mean 5, std sqrt((25 + 25) / 1) = sqrt(50)
    s = math.sqrt(50.0)
    assert_close(grpo(returns, ids, eps=0.0), [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0, -5 / s, 5 / s])
    assert_close(grpo(returns, ids, eps=1.0), [-0.5, 0.0, 0.5, 0.0, 0.0, 0.0, -5 / (s + 1), 5 / (s + 1)])
    assert_close(grpo(returns, ids, scale_by_std=False), [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0, -5.0, 5.0])


def test_grpo_edge_cases():
    assert_close(grpo(t([0.1, 0.1, 0.1]), torch.tensor([0, 0, 0])), [0.0, 0.0, 0.0])  # all equal
    huge = grpo(t([1e30, -1e30, 3e38]), torch.tensor([0, 0, 1]))
    assert_close(huge, [1 / math.sqrt(2), -1 / math.sqrt(2), 0.0])
    assert grpo(t([1.0, 2.0]).bfloat16(), torch.tensor([0, 0])).dtype == torch.float32
    with pytest.raises(ValueError, match="NaN"):
        grpo(t([1.0, math.nan]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="integer"):
        grpo(t([1.0, 2.0]), t([0.0, 0.0]))


def test_rloo_hand_computed():
    # group 7: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5; group 0: 0 - 10, 10 - 0
    assert_close(rloo(t(GROUP_RETURNS), torch.tensor(GROUP_IDS)), [-1.5, 0, 1.5, 0, 0, 0, -10.0, 10.0])


def test_gigpo_hand_computed():
    """Two episodes of group 0 meet in states s0 and s1; a third (group 1) sees s0 alone."""
    step_rewards = t([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    step_mask = b([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    state_keys = [["s0", "s1", "s0"], ["s0", "s1"], ["s0"]]
    gamma, omega = 0.5, 0.5
    # episode level: returns a = 1, b = 0 (group 0, mean 0.5, std sqrt(0.5)); c alone -> 0
    episode = 0.5 / statistics.stdev([1.0, 0.0])
    # step returns: a = [0.25, 0.5, 1], b = [0, 0], c = [1]
    # anchors (group 0, s0) = {a0: 0.25, b0: 0, a2: 1}; (group 0, s1) = {a1: 0.5, b1: 0}; c0 alone
    s0 = [0.25, 0.0, 1.0]
    s0_mean, s0_std = statistics.mean(s0), statistics.stdev(s0)
    s1_step = 0.25 / statistics.stdev([0.5, 0.0])
    expected = [
        [
            episode + omega * (0.25 - s0_mean) / s0_std,
            episode + omega * s1_step,
            episode + omega * (1.0 - s0_mean) / s0_std,
        ],
        [-episode + omega * (0.0 - s0_mean) / s0_std, -episode - omega * s1_step, 0.0],
        [0.0, 0.0, 0.0],
    ]
    advantages = gigpo(step_rewards, step_mask, state_keys, torch.tensor([0, 0, 1]), gamma, omega, eps=0.0)
    assert advantages.dtype == torch.float32
    assert_close(advantages, expected)


def test_gigpo_rejects_inconsistent_inputs():
    with pytest.raises(ValueError, match="prefix"):
        gigpo(t([[1.0, 1.0]]), b([[0, 1]]), [["s"]], torch.tensor([0]), 1.0)
    with pytest.raises(ValueError, match="one key per real step"):
        gigpo(t([[1.0, 1.0]]), b([[1, 1]]), [["s"]], torch.tensor([0]), 1.0)


def test_broadcast_and_whiten():
    assert_close(broadcast(t([2.0, -1.0]), b([[1, 0, 1], [0, 1, 1]])), [[2.0, 0, 2.0], [0, -1.0, -1.0]])
    # masked entries 1, 2, 3, 6: mean 3, unbiased var (4 + 1 + 0 + 9) / 3 = 14/3
    values = t([[1.0, X, 2.0], [3.0, 6.0, X]])
    whitened = whiten(values, b([[1, 0, 1], [1, 1, 0]]), eps=0.0)
    sd = math.sqrt(14 / 3)
    assert_close(whitened, [[-2 / sd, 0, -1 / sd], [0, 3 / sd, 0]])
    assert_close(whiten(values, b([[0, 0, 0], [0, 0, 0]])), torch.zeros(2, 3))
    assert torch.isfinite(whiten(t([[1e30, -1e30, 3e38]]), b([[1, 1, 1]]))).all()


# --- registry ---------------------------------------------------------------------------------


def _registry_inputs(with_values=True, with_keys=True):
    return AdvantageInputs(
        rewards=t(TURN_REWARDS),
        mask=b(TURN_MASK),
        turn_end=b(TURN_END),
        group_ids=torch.tensor([0, 0]),
        episode_returns=t([3.0, 1.5]),
        values=t(TURN_VALUES) if with_values else None,
        state_keys=[["a", "b"], ["a", "c", "d"]] if with_keys else None,
    )


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_registered_estimator_masks_its_output(name):
    estimator = ADVANTAGE_ESTIMATORS[name]
    advantages, returns = estimator.compute(_registry_inputs(), AdvantageParams())
    assert advantages.shape == (2, 9) and torch.isfinite(advantages).all()
    assert (advantages[~b(TURN_MASK)] == 0).all()
    assert (returns is not None) == estimator.uses_critic


def test_registry_uses_the_params():
    params = AdvantageParams(gamma=0.5, lam=0.5, gamma_token=0.9, lam_token=0.8)
    advantages, returns = ADVANTAGE_ESTIMATORS["bilevel_gae"].compute(_registry_inputs(), params)
    assert_close(advantages, BILEVEL_ADVANTAGES)
    grpo_advantages, _ = ADVANTAGE_ESTIMATORS["grpo"].compute(_registry_inputs(), AdvantageParams())
    # two episodes, returns 3 and 1.5: +-0.75 / stdev = +-1/sqrt(2)
    assert_close(grpo_advantages[:, 1], [1 / math.sqrt(2), -1 / math.sqrt(2)])


def test_registry_reports_missing_inputs():
    with pytest.raises(ValueError, match="critic values"):
        ADVANTAGE_ESTIMATORS["gae"].compute(_registry_inputs(with_values=False), AdvantageParams())
    with pytest.raises(ValueError, match="state_keys"):
        ADVANTAGE_ESTIMATORS["gigpo"].compute(_registry_inputs(with_keys=False), AdvantageParams())
