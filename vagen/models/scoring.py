"""Per-token log-probs, entropies and values of given token ids, micro-batched, images included.

logp[b, i] = log softmax(z[b, i-1] / T)[input_ids[b, i]]  with z the model's logits, T the temperature;
entropy[b, i] = -sum_v p_v log p_v of that same distribution. Position 0 (no context) and padding get 0.
Rows are right-padded; each micro-batch is cut to its longest row, so short rows cost no padding
compute, and the forward arguments (positions included) come from the family's adapter
(vagen.models.adapters).
Gradients flow when called outside `torch.no_grad()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vagen.algo.losses import entropy_from_logits
from vagen.models.adapters import adapter_for
from vagen.models.loading import model_inputs
from vagen.models.vision import VisionInputs, split_by_rows


def _micro_batches(
    config, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: VisionInputs | None, size: int
):
    """Yield (rows slice, input_ids, attention_mask, vision) per micro-batch, trimmed to its longest row."""
    if size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {size}")
    if vision is not None:
        adapter = adapter_for(config)
        tokens_of_image = adapter.image_token_counts(config, vision).tolist()
        per_row = split_by_rows(input_ids, vision, tokens_of_image, adapter.image_token_id(config))
    for start in range(0, input_ids.shape[0], size):
        rows = slice(start, start + size)
        length = int(attention_mask[rows].sum(dim=1).max())
        row_vision = None
        if vision is not None:
            parts = [v for v in per_row[rows] if v is not None]
            row_vision = VisionInputs.cat(parts) if parts else None
        yield rows, input_ids[rows, :length], attention_mask[rows, :length], row_vision


def _unwrap_config(model):
    return model.config if hasattr(model, "config") else model.module.config


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits (B, L, V), labels (B, L) -> log p(label) (B, L) and entropy (B, L) | None, in float32.

    log p(y) = z_y - logsumexp(z); the entropy comes from vagen.algo.losses.entropy_from_logits,
    which never holds a second (B, L, V) tensor.
    """
    logits = logits.float()
    logp = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logp, entropy_from_logits(logits) if with_entropy else None


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: VisionInputs | None,
    micro_batch_size: int,
    with_entropy: bool,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """input_ids, attention_mask (B, L), right-padded -> logp (B, L), entropy (B, L) | None, float32.

    `vision` holds the images of all rows in row order; each micro-batch gets its rows' images.
    """
    logp, entropy, _ = token_and_candidate_logprobs(
        model, input_ids, attention_mask, vision, micro_batch_size, with_entropy, temperature
    )
    return logp, entropy


def token_and_candidate_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: VisionInputs | None,
    micro_batch_size: int,
    with_entropy: bool,
    temperature: float = 1.0,
    candidates: torch.Tensor | None = None,
    at: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`token_logprobs`, and from the same forward pass the log-probs of K candidate tokens in place of
    the token at each marked position: candidate_logp[b, i, k] = log softmax(z[b, i-1] / T)[candidates[k]]
    where at[b, i] (B, L) bool, 0 elsewhere -> (B, L, K) float32.

    This is the policy over a turn's alternatives (e.g. every action name) where it chose one of them.
    """
    config = _unwrap_config(model)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros_like(logp) if with_entropy else None
    candidate_logp = None
    if candidates is not None:
        candidate_logp = torch.zeros((*input_ids.shape, len(candidates)), device=input_ids.device)
    for rows, ids, mask, row_vision in _micro_batches(
        config, input_ids, attention_mask, vision, micro_batch_size
    ):
        logits = model(**model_inputs(config, ids, mask, row_vision), use_cache=False).logits  # (b, l, V)
        logits = logits[:, :-1] if temperature == 1.0 else logits[:, :-1] / temperature
        chunk_logp, chunk_entropy = logprobs_from_logits(logits, ids[:, 1:], with_entropy)
        valid = mask[:, 1:].to(chunk_logp.dtype)
        length = ids.shape[1]
        logp[rows, 1:length] = chunk_logp * valid
        if with_entropy:
            entropy[rows, 1:length] = chunk_entropy * valid
        if candidates is not None:
            marked = at[rows, 1:length]  # (b, l - 1)
            picked = logits[marked].float()  # (m, V): the logits each marked token was sampled from
            normaliser = picked.logsumexp(dim=-1, keepdim=True)
            candidate_logp[rows, 1:length][marked] = picked[:, candidates] - normaliser
    return logp, entropy, candidate_logp


def token_values(
    critic: Callable[..., torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: VisionInputs | None,
    micro_batch_size: int,
) -> torch.Tensor:
    """A ValueModel's values (B, L) float32 over micro-batches, aligned like `token_logprobs`:
    values[b, i] is the critic's output at position i - 1, V of the context x[b, <i] that token i is
    sampled from -- not of a context that already holds token i, which would make the baseline of an
    action token depend on the action (V(i) = Q(s, a)) and cancel its advantage. Position 0 and
    padding get 0.
    """
    config = _unwrap_config(critic)
    values = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for rows, ids, mask, row_vision in _micro_batches(
        config, input_ids, attention_mask, vision, micro_batch_size
    ):
        length = ids.shape[1]
        values[rows, 1:length] = critic(ids, mask, row_vision)[:, :-1] * mask[:, 1:]
    return values


@dataclass
class Scores:
    """A batch's per-token scores, (B, L) float32 each ((B, L, K) for the action log-probs)."""

    old_logp: torch.Tensor  # actor at rollout time
    entropy: torch.Tensor  # actor's entropy at rollout time
    ref_logp: torch.Tensor | None  # frozen reference
    values: torch.Tensor | None  # a V critic's (a Q critic scores no tokens)
    action_logp: torch.Tensor | None = None  # the actor's log-probs of every action token (mpo)

    def select(self, rows: torch.Tensor) -> Scores:
        return Scores(*(None if t is None else t[rows] for t in vars(self).values()))

    def trim(self, length: int) -> Scores:
        """Every field cut to its first `length` tokens."""
        return Scores(*(None if t is None else t[:, :length] for t in vars(self).values()))
