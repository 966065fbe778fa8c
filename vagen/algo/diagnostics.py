"""Collapse diagnostics from RAGEN (arXiv:2504.20073) for the trainer to log and alarm on.

The paper's "echo trap": the return std within groups falls before performance does, entropy
turns erratic, gradient-norm spikes mark irreversible collapse, and the reasoning becomes a fixed
template regardless of the input. Everything here is deterministic, pure python / torch.
"""

import math
import re
import statistics
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from vagen.algo.groups import group_stats
from vagen.algo.losses import masked_mean


def mean_group_return_std(returns: Tensor, group_ids: Tensor) -> Tensor:
    """Mean over groups of >= 2 members of the unbiased std of their raw returns; 0-dim float32.

    returns (B,), group_ids (B,) integer. 0 when no group has two members.
    """
    stats = group_stats(returns, group_ids)
    return masked_mean(stats.std, stats.counts > 1).to(torch.float32)


def masked_entropy_mean(entropy: Tensor, mask: Tensor) -> Tensor:
    """Mean token entropy over the masked tokens; entropy, mask (B, L); 0-dim float32, 0 if empty."""
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy and mask shapes differ: {tuple(entropy.shape)} vs {tuple(mask.shape)}")
    return masked_mean(entropy.detach().float(), mask)


_WORD = re.compile(r"\w+|[^\w\s]")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass
class TemplateScore:
    """How template-like a batch of reasoning texts is."""

    distinct_n: float  # unique n-grams / all n-grams over the batch (low: repetitive); 0 with no n-grams
    cross_state_overlap: float  # mean Jaccard overlap of word sets over pairs from different states
    num_pairs: int  # pairs behind cross_state_overlap (0: overlap undefined, reported as 0)


def template_score(texts: list[str], state_keys: list[Hashable], n: int = 2) -> TemplateScore:
    """Distinct-n and cross-state overlap of reasoning texts (e.g. the `<think>` contents of a batch).

    Texts are lower-cased and split into words and punctuation marks.
        distinct_n = |unique n-grams| / |n-grams|, counted over all texts together;
        cross_state_overlap = mean over pairs (i, j) with state_keys[i] != state_keys[j] of
                              |W_i & W_j| / |W_i | W_j|   (W: the text's word set; two empty texts: 1).
    High overlap across DIFFERENT initial states means the reasoning ignores its input.
    O(N^2) pairs: meant for a batch (hundreds of texts), not a dataset.
    """
    if len(texts) != len(state_keys):
        raise ValueError(f"{len(texts)} texts but {len(state_keys)} state keys")
    words = [_words(text) for text in texts]
    ngrams = [tuple(w[i : i + n]) for w in words for i in range(len(w) - n + 1)]
    distinct_n = len(set(ngrams)) / len(ngrams) if ngrams else 0.0

    word_sets = [set(w) for w in words]
    overlaps = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if state_keys[i] == state_keys[j]:
                continue
            union = word_sets[i] | word_sets[j]
            overlaps.append(len(word_sets[i] & word_sets[j]) / len(union) if union else 1.0)
    overlap = sum(overlaps) / len(overlaps) if overlaps else 0.0
    return TemplateScore(distinct_n=distinct_n, cross_state_overlap=overlap, num_pairs=len(overlaps))


@dataclass
class DetectorFlags:
    """What one `CollapseDetector.update` found."""

    spike: bool  # value > spike_factor * median of the previous `window` values, or not finite
    drop: bool  # value < drop_fraction * running max for the last `drop_patience` steps (inclusive)


class CollapseDetector:
    """Watches one non-negative series (grad norm, entropy, in-group return std), one value per step.

    Spike: value > spike_factor * median(previous `window` finite values), once `min_history`
    values are known and the median is positive; a NaN or inf value always counts as a spike and
    is not recorded. Drop: value < drop_fraction * (max of all finite values so far) on
    `drop_patience` consecutive steps; flagged on every step while it lasts.
    """

    def __init__(
        self,
        window: int = 20,
        spike_factor: float = 3.0,
        drop_fraction: float = 0.5,
        drop_patience: int = 5,
        min_history: int = 5,
    ) -> None:
        if window < 1 or drop_patience < 1 or min_history < 1 or spike_factor <= 0 or drop_fraction <= 0:
            raise ValueError("window, drop_patience, min_history, spike_factor, drop_fraction must be > 0")
        self.spike_factor = spike_factor
        self.drop_fraction = drop_fraction
        self.drop_patience = drop_patience
        self.min_history = min_history
        self.recent: deque[float] = deque(maxlen=window)
        self.running_max = float("-inf")
        self.steps_below = 0

    def update(self, value: float) -> DetectorFlags:
        value = float(value)
        if not math.isfinite(value):
            return DetectorFlags(spike=True, drop=False)
        spike = False
        if len(self.recent) >= self.min_history:
            median = statistics.median(self.recent)
            spike = median > 0 and value > self.spike_factor * median
        self.recent.append(value)
        self.running_max = max(self.running_max, value)
        below = self.running_max > 0 and value < self.drop_fraction * self.running_max
        self.steps_below = self.steps_below + 1 if below else 0
        return DetectorFlags(spike=spike, drop=self.steps_below >= self.drop_patience)
