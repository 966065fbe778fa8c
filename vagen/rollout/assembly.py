"""Token in, token out: each episode's rows are built from the chat template's own tokens plus exactly
the token ids the engine sampled -- assistant text is never re-tokenised.

Turn t's context text is C_t = render([system, kept turns, user_t], add_generation_prompt=True), where the
kept turns are all earlier turns (window None), or the first turn (its message holds the task instructions;
not pinned when they are in the system prompt) plus the last `window` ones. The episode's current row
(segment) holds the tokens of its text S (the context plus the replies sampled so far). If S is a prefix of
C_t, only the suffix C_t[len(S):] is tokenised (the processor expands the new images' pads) and appended;
otherwise -- a dropped turn (window) or a template that rewrites history -- a new segment starts from C_t
tokenised whole. So the row the update scores is, token for token, the context the engine saw.

With a stop token, the sampled ids end in the end-of-turn token (`<|im_end|>`) and S gains its text; when
the reply was cut by length, the template's end-of-turn text arrives with the next suffix, unmasked.
Anything the template puts after `<|im_end|>` (Qwen2.5-VL's "\n") is context of the next turn: in no mask.

Masks of a turn's sampled tokens (positions a..b-1 of the row, e = b-1 the turn end):
  spans "all":   every sampled token.
  span names:    tokens whose characters overlap a selected parse span (character offsets of each
                 token from incremental decoding), plus the end-of-turn token.
  always:        the turn end e is in adv_mask (turn-level credit needs its anchor); the turn reward sits
                 at e in token_rewards.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from PIL import Image

from vagen.models.loading import processor_adapter, tokenizer_of
from vagen.models.vision import VisionInputs, as_pil

IMAGE_PLACEHOLDER = "<image>"


@dataclass
class Encoded:
    """Token ids of one piece of text, with the patches of the images it holds."""

    token_ids: list[int]
    vision: VisionInputs | None


class ChatCodec:
    """The model's chat template and tokenizer/processor: messages -> text -> token ids, and back."""

    def __init__(self, processor_or_tokenizer, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer_of(processor_or_tokenizer)
        self.processor = (
            processor_or_tokenizer if hasattr(processor_or_tokenizer, "image_processor") else None
        )
        self.adapter = processor_adapter(processor_or_tokenizer)
        self.template = (
            chat_template
            or getattr(processor_or_tokenizer, "chat_template", None)
            or self.tokenizer.chat_template
        )
        if self.template is None:
            raise ValueError("the tokenizer has no chat template; set rollout.chat_template to a jinja file")
        self.end_of_turn_text = self._end_of_turn_text()
        end_ids = self.tokenizer.encode(self.end_of_turn_text, add_special_tokens=False)
        if not end_ids or not self.end_of_turn_text.startswith(self.tokenizer.decode(end_ids[:1])):
            raise ValueError(f"cannot find the end-of-turn token in the template's {self.end_of_turn_text!r}")
        self.stop_token_ids = end_ids[:1]
        vocab = self.tokenizer.get_vocab()
        self.banned_token_ids = {vocab[token] for token in self.adapter.context_only_tokens if token in vocab}
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.stop_token_ids[0]

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _end_of_turn_text(self) -> str:
        """What the template writes right after an assistant message's content (e.g. "<|im_end|>\\n")."""
        sentinel = "Qx7Zv"
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        prompt = self.render(messages, add_generation_prompt=True)
        full = self.render(
            [*messages, {"role": "assistant", "content": sentinel}], add_generation_prompt=False
        )
        if not full.startswith(prompt + sentinel):
            raise ValueError(
                "chat template: the generation prompt is not a prefix of the rendered assistant turn"
            )
        return full[len(prompt) + len(sentinel) :]

    def encode(self, text: str, images: list[Image.Image]) -> Encoded:
        """Token ids of `text`; with images, the processor expands each image's token and patchifies."""
        if not images:
            return Encoded(self.tokenizer.encode(text, add_special_tokens=False), None)
        if self.processor is None:
            raise ValueError("images given but the model has no image processor (text-only model?)")
        out = self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        return Encoded(out["input_ids"][0].tolist(), self.adapter.vision_inputs(out))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def char_ends(self, token_ids: list[int]) -> list[int]:
        """End character offset of each token in decode(token_ids), by decoding growing prefixes
        (kept non-decreasing: a byte sequence split across tokens shows up where it completes)."""
        ends, last = [], 0
        for i in range(len(token_ids)):
            last = max(last, len(self.decode(token_ids[: i + 1])))
            ends.append(last)
        return ends


class ActionReadout(NamedTuple):
    """Where a well-formed reply chooses its action: per action name, the token at the first position
    where the names' `<answer>{name}</answer>` tokenizations differ, and where that token starts relative
    to the name's first character (-1 when the tokenizer merges the tag's ">" into it: `>Down`)."""

    token_ids: list[int]
    char_offset: int


def action_readout(codec: ChatCodec, action_names: tuple[str, ...] | list[str]) -> ActionReadout:
    """The ActionReadout of these names. The choice is one position for all of them: the tiny tokenizer
    writes `>Left` but `>` + `F` for Forward, so the token holding each name's first character would sit
    at different positions."""
    tokenize = codec.tokenizer
    encoded = [tokenize(f"<answer>{n}</answer>", add_special_tokens=False)["input_ids"] for n in action_names]
    position = next((i for i, column in enumerate(zip(*encoded, strict=False)) if len(set(column)) > 1), 0)
    offset = len(codec.decode(encoded[0][:position])) - len("<answer>")
    return ActionReadout([e[position] for e in encoded], offset)


def action_token_ids(codec: ChatCodec, action_names: tuple[str, ...] | list[str]) -> list[int]:
    """Per action name, its token at the position where a reply chooses among them (action_readout).
    Raises ValueError unless the K tokens are distinct, since a policy over the actions is then read off
    that one position."""
    ids = action_readout(codec, action_names).token_ids
    if len(set(ids)) != len(ids):
        raise ValueError(
            f"the action names {list(action_names)} are not told apart by one token after <answer> "
            f"({[codec.decode([i]) for i in ids]}): a policy over them cannot be read off one position"
        )
    return ids


def user_message(text: str, num_images: int, text_only: bool) -> dict:
    """A chat message from an observation whose text marks each image by IMAGE_PLACEHOLDER."""
    if text_only:
        return {"role": "user", "content": text}
    pieces = text.split(IMAGE_PLACEHOLDER)
    if len(pieces) - 1 != num_images:
        raise ValueError(f"observation has {len(pieces) - 1} image placeholders but {num_images} images")
    content: list[dict] = []
    for i, piece in enumerate(pieces):
        if i > 0:
            content.append({"type": "image"})
        if piece:
            content.append({"type": "text", "text": piece})
    return {"role": "user", "content": content}


@dataclass
class Segment:
    """One row: the tokens of one context the engine saw, plus the replies sampled on top of it."""

    text: str
    token_ids: list[int]
    images: list[Image.Image]
    vision: list[VisionInputs] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    adv_mask: list[bool] = field(default_factory=list)
    turn_end: list[bool] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    token_turn: list[int] = field(default_factory=list)
    action_token: list[bool] = field(default_factory=list)

    def append(
        self, text: str, token_ids: list[int], logprobs: list[float] | None = None, turn: int = -1
    ) -> None:
        """Add tokens, unmasked for now: sampled ones (with their logprobs and turn) or context."""
        n = len(token_ids)
        self.text += text
        self.token_ids += token_ids
        self.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * n
        self.loss_mask += [False] * n
        self.adv_mask += [False] * n
        self.turn_end += [False] * n
        self.rewards += [0.0] * n
        self.token_turn += [turn] * n
        self.action_token += [False] * n


@dataclass
class PendingContext:
    """The context of the next turn, not yet committed (so a context budget can still refuse it)."""

    new_segment: bool
    text: str
    encoded: Encoded
    images: list[Image.Image]
    prompt_length: int


@dataclass
class _Turn:
    """One turn's chat messages: the observation (with its images) and the reply (once sampled)."""

    user: dict
    images: list[Image.Image]
    reply: dict | None = None


@dataclass
class SampledTurn:
    """Where a turn's sampled ids sit in its row, and their decoded text."""

    start: int
    token_ids: list[int]
    reply: str
    stopped: bool


class EpisodeAssembler:
    """Builds one episode's rows (segments) turn by turn; see the module docstring for the rules."""

    def __init__(
        self,
        codec: ChatCodec,
        system_prompt: str,
        window: int | None,
        text_only: bool,
        pin_first_turn: bool = True,
        keep_vision: bool = True,
    ) -> None:
        """`keep_vision=False`: the rows keep no image patches (for episodes played only for their
        records, whose rows are never collated; the engine gets the images themselves)."""
        self.codec = codec
        self.keep_vision = keep_vision
        self.window = window
        self.pinned = 1 if pin_first_turn else 0
        self.text_only = text_only
        self.system = {"role": "system", "content": system_prompt}
        self.turns: list[_Turn] = []
        self.segments: list[Segment] = []
        self.last: SampledTurn | None = None
        self.num_new_segments_by_template = 0

    def prepare(self, text: str, images: list[np.ndarray]) -> PendingContext:
        """Context of the next turn given its observation (Observation.text / .images)."""
        pil = [as_pil(image) for image in images]
        self.turns.append(_Turn(user_message(text, len(pil), self.text_only), pil))
        completed = self.turns[:-1]
        kept = (
            completed
            if self.window is None
            else completed[: self.pinned] + completed[max(self.pinned, len(completed) - self.window) :]
        )
        messages = (
            [self.system] + [m for turn in kept for m in (turn.user, turn.reply)] + [self.turns[-1].user]
        )
        context = self.codec.render(messages, add_generation_prompt=True)
        segment = self.segments[-1] if self.segments else None
        if segment is not None and context.startswith(segment.text):
            suffix = context[len(segment.text) :]
            encoded = self.codec.encode(suffix, pil)
            return PendingContext(
                False, suffix, encoded, pil, len(segment.token_ids) + len(encoded.token_ids)
            )
        window_images = [image for turn in kept for image in turn.images] + pil
        encoded = self.codec.encode(context, window_images)
        if segment is not None and len(kept) == len(completed):
            self.num_new_segments_by_template += 1  # nothing was dropped: the template rewrote history
        return PendingContext(True, context, encoded, window_images, len(encoded.token_ids))

    def commit(self, pending: PendingContext) -> tuple[list[int], list[Image.Image]]:
        """Add the context to the episode; returns the prompt (token ids, images) for the engine."""
        if pending.new_segment:
            self.segments.append(Segment(text="", token_ids=[], images=[]))
        segment = self.segments[-1]
        segment.append(pending.text, pending.encoded.token_ids)
        segment.images += pending.images
        if pending.encoded.vision is not None and self.keep_vision:
            segment.vision.append(pending.encoded.vision)
        return list(segment.token_ids), list(segment.images)

    def withdraw(self) -> None:
        """Forget the observation given to `prepare` (the turn will not be played)."""
        self.turns.pop()

    def add_reply(self, token_ids: list[int], logprobs: list[float], stopped: bool) -> str:
        """Append the sampled ids (with their logprobs) to the row; returns the reply text for the env."""
        if not token_ids:
            raise ValueError("the engine returned an empty generation (max_new_tokens must be >= 1)")
        segment = self.segments[-1]
        reply_ids = token_ids[:-1] if stopped else token_ids
        reply = self.codec.decode(reply_ids)
        self.last = SampledTurn(len(segment.token_ids), list(token_ids), reply, stopped)
        self.turns[-1].reply = {"role": "assistant", "content": reply}
        segment.append(self.codec.decode(token_ids), token_ids, logprobs, turn=len(self.turns) - 1)
        return reply

    def finish_turn(
        self,
        reward: float,
        spans: dict[str, tuple[int, int]],
        loss_spans: str | list[str],
        adv_spans: str | list[str],
        action_char: int | None = None,
        action_token_id: int | None = None,
    ) -> None:
        """Set the masks of the last reply's tokens and put its reward at its turn end; with
        `action_char` (the reply offset where the reply chooses the turn's first executed action,
        ActionReadout.char_offset before its name), mark the token holding that character as the turn's
        action token, unless `action_token_id` is given and the sampled token is another (a reply that
        spelled the action with other tokens)."""
        turn, segment = self.last, self.segments[-1]
        start, end = turn.start, turn.start + len(turn.token_ids)
        needs_ends = action_char is not None or loss_spans != "all" or adv_spans != "all"
        ends = self.codec.char_ends(turn.token_ids) if needs_ends else []  # decoded once per turn
        loss = self._span_mask(turn, ends, spans, loss_spans)
        adv = self._span_mask(turn, ends, spans, adv_spans)
        adv[-1] = True
        segment.loss_mask[start:end] = loss
        segment.adv_mask[start:end] = adv
        segment.turn_end[end - 1] = True
        segment.rewards[end - 1] = float(reward)
        if action_char is not None:
            index = next(i for i, e in enumerate(ends) if e > action_char)
            if action_token_id is None or turn.token_ids[index] == action_token_id:
                segment.action_token[start + index] = True

    @staticmethod
    def _span_mask(
        turn: SampledTurn, ends: list[int], spans: dict[str, tuple[int, int]], selected
    ) -> list[bool]:
        """Per token of the turn: whether it overlaps a selected span (`ends`: the tokens' character ends,
        ChatCodec.char_ends); the end-of-turn token is always in."""
        n = len(turn.token_ids)
        if selected == "all":
            return [True] * n
        reply_len = n - 1 if turn.stopped else n
        reply_ends = ends[:reply_len]
        starts = [0, *reply_ends][:reply_len]  # an empty reply (the end-of-turn token alone) has no tokens
        ranges = [spans[name] for name in selected if name in spans]
        mask = [any(s < b and a < e for a, b in ranges) for s, e in zip(starts, reply_ends, strict=True)]
        return mask + [True] * (n - reply_len)
