"""Policy/value losses, KL estimators and entropy against hand-worked numbers."""

import math

import pytest
import torch

from vagen.algo.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    entropy_from_logits,
    kl,
    ppo_policy_loss,
    stats_to_floats,
    value_loss,
)


def assert_close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# Five masked tokens (row 0: three + a NaN padding slot, row 1: two + two padding slots), with
# clip_low = 0.2, clip_high = 0.28:
#   rho  A    -A*rho  -A*clip(rho, 0.8, 1.28)   max     clipped?
#   1.5  1    -1.5    -1.28                     -1.28   upper
#   0.5  -2   1.0     1.6                       1.6     lower
#   1.1  2    -2.2    -2.2                      -2.2    -
#   0.7  1    -0.7    -0.8                      -0.7    - (A > 0: the low side is not clipped)
#   4.0  -2   8.0     2.56                      8.0     - (dual clip c = 3 caps it at 6)
RATIOS = [[1.5, 0.5, 1.1, 1.0], [0.7, 4.0, 1.0, 1.0]]
ADVANTAGES = [[1.0, -2.0, 2.0, 0.0], [1.0, -2.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]


def _policy_inputs():
    old_logp = torch.tensor([[-1.0, -2.0, -0.5, math.nan], [-3.0, -1.0, math.nan, math.inf]])
    logp = (old_logp + torch.tensor(RATIOS).log()).requires_grad_()
    advantages = torch.tensor(ADVANTAGES)
    advantages[0, 3] = math.nan
    return logp, old_logp, advantages, torch.tensor(MASK, dtype=torch.bool)


@pytest.mark.parametrize(
    ("agg", "dual_clip", "expected"),
    [
        ("token-mean", None, (-1.28 + 1.6 - 2.2 - 0.7 + 8.0) / 5),
        ("token-mean", 3.0, (-1.28 + 1.6 - 2.2 - 0.7 + 6.0) / 5),
        ("seq-mean-token-sum", None, ((-1.28 + 1.6 - 2.2) + (-0.7 + 8.0)) / 2),
        ("seq-mean-token-mean", None, ((-1.28 + 1.6 - 2.2) / 3 + (-0.7 + 8.0) / 2) / 2),
    ],
)
def test_ppo_policy_loss_hand_computed(agg, dual_clip, expected):
    logp, old_logp, advantages, mask = _policy_inputs()
    loss, stats = ppo_policy_loss(
        logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip, agg=agg
    )
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    floats = stats_to_floats(stats)
    assert floats["clip_frac_upper"] == pytest.approx(0.2)
    assert floats["clip_frac_lower"] == pytest.approx(0.2)
    assert floats["dual_clip_frac"] == pytest.approx(0.2 if dual_clip else 0.0)
    assert floats["ratio_min"] == pytest.approx(0.5)
    assert floats["ratio_max"] == pytest.approx(4.0)
    assert floats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.7 + 4.0) / 5)
    expected_kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 0.7, 4.0)) / 5
    assert floats["approx_kl"] == pytest.approx(expected_kl, abs=1e-6)


def test_ppo_policy_loss_gradient():
    """d/dlogp of -A*rho is -A*rho on unclipped tokens, 0 on clipped ones and on padding (NaN there)."""
    logp, old_logp, advantages, mask = _policy_inputs()
    loss, _ = ppo_policy_loss(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert_close(logp.grad, [[0.0, 0.0, -2.2 / 5, 0.0], [-0.7 / 5, 8.0 / 5, 0.0, 0.0]])


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "seq-mean-token-mean"])
def test_seq_mean_aggregations_skip_empty_rows(agg):
    # row 0: two tokens with rho = 1 and A = 1, 3 -> per-token -1, -3; row 1: nothing masked
    advantages = torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    loss, _ = ppo_policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), advantages, mask, agg=agg)
    assert loss.item() == pytest.approx(-4.0 if agg == "seq-mean-token-sum" else -2.0)


def test_ppo_policy_loss_edge_cases():
    logp = torch.zeros(2, 3, requires_grad=True)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    loss, stats = ppo_policy_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), empty)
    loss.backward()
    assert loss.item() == 0.0 and stats_to_floats(stats)["ratio_min"] == 1.0
    # huge advantages and far-apart log-probs: finite loss and gradient
    logp = torch.tensor([[0.0, -50.0, 30.0]], requires_grad=True)
    huge = torch.tensor([[1e30, -1e30, 1e30]])
    loss, _ = ppo_policy_loss(logp, torch.zeros(1, 3), huge, torch.ones(1, 3, dtype=torch.bool))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    # bf16 log-probs: computed in float32
    loss, _ = ppo_policy_loss(
        torch.zeros(1, 2, dtype=torch.bfloat16),
        torch.zeros(1, 2, dtype=torch.bfloat16),
        torch.ones(1, 2, dtype=torch.bfloat16),
        torch.ones(1, 2, dtype=torch.bool),
    )
    assert loss.dtype == torch.float32 and loss.item() == -1.0
    with pytest.raises(ValueError, match="aggregation"):
        ppo_policy_loss(logp, logp, logp, torch.ones(1, 3, dtype=torch.bool), agg="sum")
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, logp, logp, torch.ones(1, 3, dtype=torch.bool), dual_clip=0.5)


def test_aggregation_units_count_tokens_or_rows():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    rows = torch.arange(3)  # each row its own episode
    assert LOSS_AGGREGATIONS["token-mean"].units(mask, rows).tolist() == [2, 0, 3]
    assert LOSS_AGGREGATIONS["seq-mean-token-sum"].units(mask, rows).tolist() == [1, 0, 1]
    assert LOSS_AGGREGATIONS["seq-mean-token-mean"].units(mask, rows).tolist() == [1, 0, 1]
    assert LOSS_AGGREGATIONS["episode-mean"].units(mask, rows).tolist() == [1, 0, 1]


def test_value_loss_hand_computed():
    # clip 0.2:  V    V_old  R    V_clip  (V-R)^2  (V_clip-R)^2  0.5*max
    #            1.0  0.5    2.0  0.7     1        1.69          0.845  (clipped wins)
    #            2.0  2.0    1.0  2.0     1        1             0.5
    #            0.0  0.4    0.0  0.2     0        0.04          0.02   (clipped wins)
    values = torch.tensor([[1.0, 2.0, 0.0, math.nan]], requires_grad=True)
    old_values = torch.tensor([[0.5, 2.0, 0.4, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0, math.inf]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    loss, stats = value_loss(values, old_values, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx((0.845 + 0.5 + 0.02) / 3)
    floats = stats_to_floats(stats)
    assert floats["clip_frac"] == pytest.approx(2 / 3)
    # explained variance 1 - Var[R - V] / Var[R]: R = [2, 1, 0], R - V = [1, -1, 0]: both variances 2/3
    assert floats["explained_variance"] == pytest.approx(0.0, abs=1e-6)
    assert floats["values_mean"] == pytest.approx(1.0) and floats["returns_mean"] == pytest.approx(1.0)
    loss.backward()
    assert torch.isfinite(values.grad).all()
    unclipped, _ = value_loss(values, old_values, returns, mask, clip=None)
    assert unclipped.item() == pytest.approx(0.5 * (1 + 1 + 0) / 3)


def test_value_loss_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    values = torch.tensor([[1.5, 2.0, 3.0, 4.5]])
    # R - V = [-0.5, 0, 0, -0.5]: population var 0.0625; Var[R] = 1.25
    _, stats = value_loss(values, values, returns, mask)
    assert stats_to_floats(stats)["explained_variance"] == pytest.approx(1 - 0.0625 / 1.25)
    _, constant = value_loss(values, values, torch.ones(1, 4), mask)
    assert stats_to_floats(constant)["explained_variance"] == 0.0
    rounding = torch.tensor([[0.0, 1e-7, 0.0, -1e-7]])  # Var 5e-15: equal returns up to float noise
    _, noise = value_loss(values, values, rounding, mask)
    assert stats_to_floats(noise)["explained_variance"] == 0.0


def test_kl_estimators_hand_computed():
    logp, ref_logp = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])  # log r = [0.5, -1]
    assert_close(kl(logp, ref_logp, "k1"), [[0.5, -1.0]])
    assert_close(kl(logp, ref_logp, "k2"), [[0.125, 0.5]])
    assert_close(kl(logp, ref_logp, "k3"), [[math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]])
    assert_close(kl(logp, ref_logp, "abs"), [[0.5, 1.0]])
    far = kl(torch.tensor([[-100.0, 0.0]]), torch.tensor([[0.0, -100.0]]), "k3")
    assert torch.isfinite(far).all() and (far >= 0).all()
    assert kl(logp.bfloat16(), ref_logp.bfloat16(), "k3").dtype == torch.float32
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "abs"}
    with pytest.raises(ValueError, match="unknown KL"):
        kl(logp, ref_logp, "k4")


def test_entropy_matches_categorical():
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11, generator=gen)).requires_grad_()
    entropy = entropy_from_logits(logits, chunk_size=3)  # 10 rows in chunks of 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy, expected)
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(grad, expected_grad)


def test_entropy_dtypes_and_extremes():
    logits = torch.tensor([[0.0, 0.0, -math.inf, 1e4], [0.0, 0.0, -math.inf, 0.0]])
    entropy = entropy_from_logits(logits.bfloat16())
    assert entropy.dtype == torch.float32 and entropy.shape == (2,)
    assert_close(entropy, [0.0, math.log(3)], atol=1e-3)
    assert entropy_from_logits(torch.zeros(0, 4)).shape == (0,)


def group_with_unequal_turns():
    """One group of 8 episodes, one row each: 2 successes (return 10) in 2 and 3 turns, 6 failures in 10
    turns. Each turn is 3 sampled tokens, the middle one a shared, deterministic format token."""
    from vagen.algo import AdvantageInputs

    turns = [2, 3] + [10] * 6
    length = 3 * max(turns)
    mask = torch.zeros(8, length, dtype=torch.bool)
    turn_end = torch.zeros(8, length, dtype=torch.bool)
    for e, t in enumerate(turns):
        mask[e, : 3 * t] = True
        turn_end[e, 2 : 3 * t : 3] = True
    returns = torch.tensor([10.0, 10.0] + [0.0] * 6)
    rewards = torch.where(turn_end & (torch.arange(8)[:, None] < 2), 10.0 / torch.tensor(turns)[:, None], 0.0)
    keys = [[f"episode {e} turn {t}" for t in range(n)] for e, n in enumerate(turns)]  # no state repeats
    inputs = AdvantageInputs(rewards, mask, turn_end, torch.zeros(8, dtype=torch.long), returns, None, keys)
    format_token = torch.zeros_like(mask)
    format_token[:, 1::3] = True
    return inputs, format_token & mask


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
def test_the_default_aggregation_of_episode_advantages_leaves_a_shared_token_alone(estimator):
    """Failures run out their turns and successes stop early, so a token mean over all tokens gives the
    shared format token a net push (down, here); the per-episode mean cancels it."""
    from vagen.algo import ADVANTAGE_ESTIMATORS, AdvantageParams

    inputs, format_token = group_with_unequal_turns()
    entry = ADVANTAGE_ESTIMATORS[estimator]
    advantages, _ = entry.compute(inputs, AdvantageParams())
    assert entry.aggregation == "episode-mean"

    def format_token_gradient(agg: str) -> float:
        theta = torch.zeros((), requires_grad=True)  # the format token's log-prob, shared by every turn
        logp = torch.where(format_token, theta, torch.full(inputs.mask.shape, -0.5))
        units = LOSS_AGGREGATIONS[agg].units(inputs.mask, torch.arange(8))
        loss, _ = ppo_policy_loss(logp, logp.detach(), advantages, inputs.mask, agg=agg, units=units)
        loss.backward()
        return theta.grad.item()

    assert abs(format_token_gradient("episode-mean")) <= 1e-6
    assert format_token_gradient("token-mean") > 0.05  # the defect: every batch pushes the format down


def test_episode_mean_over_micro_batches_and_split_episodes_is_the_whole_batch_mean():
    # rows 0, 1 are one episode's two segments (2 + 1 loss tokens), row 2 another episode (2 tokens)
    per_token = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0], [10.0, 20.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    episodes = torch.tensor([0, 0, 1])
    agg = LOSS_AGGREGATIONS["episode-mean"]
    units = agg.units(mask, episodes)
    assert_close(units, torch.tensor([2 / 3, 1 / 3, 1.0], dtype=torch.float64))
    whole = agg.reduce(per_token, mask, units)
    assert_close(whole, torch.tensor((7 / 3 + 15) / 2))  # episode means 7/3 and 15, averaged
    parts = [[0], [1, 2]]  # micro-batches, weighted by their share of the units (the trainer's plan)
    split = sum(agg.reduce(per_token[p], mask[p], units[p]) * units[p].sum() / units.sum() for p in parts)
    assert_close(split.float(), whole)
