"""Token assembly and masks on hand-built conversations with the tiny VLM's processor, under our chat
template and under the real Qwen2.5-VL one (default system prompt, "\\n" after <|im_end|>)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from envs_visual.language import parse_reply
from vagen.models.loading import load_processor
from vagen.rollout.assembly import ChatCodec, EpisodeAssembler, action_readout, action_token_ids
from vagen.rollout.batch import EpisodeRecord, build_batch

# The template Qwen2.5-VL checkpoints ship (a copy of ../shared/data/qwen2_5_vl_chat_template.jinja).
QWEN_TEMPLATE = Path(__file__).resolve().parents[1] / "assets" / "tiny" / "qwen2_5_vl_chat_template.jinja"
# A template that rewrites history: earlier assistant turns lose their <think> part (like Qwen3's).
HISTORY_REWRITING_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['role'] == 'assistant' and not loop.last -%}{{ m['content'].split('</think>')[-1] }}"
    "{%- elif m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for p in m['content'] -%}{%- if p['type'] == 'image' -%}"
    "<|vision_start|><|image_pad|><|vision_end|>{%- else -%}{{ p['text'] }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def qwen_template() -> str:
    return QWEN_TEMPLATE.read_text()


@pytest.fixture(scope="module")
def processor(tiny_vlm_path):
    return load_processor(tiny_vlm_path)


@pytest.fixture(params=["ours", "qwen2.5-vl"])
def codec(request, processor):
    return ChatCodec(processor, None if request.param == "ours" else qwen_template())


def image(value: int) -> np.ndarray:
    return np.full((56, 84, 3), value, dtype=np.uint8)


def encode(codec: ChatCodec, text: str) -> list[int]:
    return codec.tokenizer.encode(text, add_special_tokens=False)


def play(codec, replies, window=None, stopped=None, spans=("all", "all"), pin_first_turn=True):
    """Play len(replies) turns with one image each; returns (assembler, prompts, sampled positions)."""
    assembler = EpisodeAssembler(codec, "Push the box.", window, False, pin_first_turn)
    prompts = []
    for t, reply_ids in enumerate(replies):
        pending = assembler.prepare(f"Turn {t}: <image> What next?", [image(10 * t)])
        prompts.append(assembler.commit(pending)[0])
        is_stopped = True if stopped is None else stopped[t]
        sampled = reply_ids + (codec.stop_token_ids if is_stopped else [])
        reply = assembler.add_reply(sampled, [-0.5] * len(sampled), is_stopped)
        spans_t = {
            tag: (reply.index(f"<{tag}>"), reply.index(f"</{tag}>") + len(f"</{tag}>"))
            for tag in ("think", "answer")
            if f"</{tag}>" in reply
        }
        if "</answer>" in reply:
            spans_t["action"] = (reply.index("<answer>") + len("<answer>"), reply.index("</answer>"))
        assembler.finish_turn(float(t + 1), spans_t, spans[0], spans[1])
    return assembler, prompts


def reply_ids(codec, think: str, answer: str) -> list[int]:
    return encode(codec, f"<think>{think}</think>") + encode(codec, f"<answer>{answer}</answer>")


def test_masks_on_two_turns_with_images(codec):
    replies = [
        encode(codec, "<think>box is left</think><answer>Left</answer>"),
        encode(codec, "<answer>Up</answer>"),
    ]
    assembler, prompts = play(codec, replies)
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    ids, loss, adv = batch.input_ids[0], batch.loss_mask[0], batch.adv_mask[0]
    assert len(batch) == 1 and torch.equal(loss, adv)
    # The row is what the processor makes of the whole rendered conversation (up to the last <|im_end|>).
    messages = [{"role": "system", "content": "Push the box."}]
    for t in range(2):
        content = [
            {"type": "text", "text": f"Turn {t}: "},
            {"type": "image"},
            {"type": "text", "text": " What next?"},
        ]
        messages += [
            {"role": "user", "content": content},
            {"role": "assistant", "content": codec.decode(replies[t])},
        ]
    text = codec.render(messages, add_generation_prompt=False)
    full = codec.processor(text=[text], images=[image(0), image(10)], return_tensors="pt")["input_ids"][0]
    assert torch.equal(ids, full[: len(ids)])
    # Exactly the sampled ids (with their <|im_end|>) are masked, at the places the prompts ended.
    expected = torch.zeros_like(loss)
    expected[len(prompts[0]) : len(prompts[0]) + len(replies[0]) + 1] = True
    expected[len(prompts[1]) : len(prompts[1]) + len(replies[1]) + 1] = True
    assert torch.equal(loss, expected)
    assert torch.equal(
        ids[loss], torch.tensor(replies[0] + codec.stop_token_ids + replies[1] + codec.stop_token_ids)
    )
    special = codec.tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|image_pad|>", "<|vision_start|>"])
    assert not loss[torch.isin(ids, torch.tensor(special))].any()
    newline = encode(codec, "\n")
    assert not loss[torch.isin(ids, torch.tensor(newline))].any()  # the template's "\n"s are context
    # Turn ends are the two sampled <|im_end|> tokens, carrying the turn rewards 1 and 2.
    ends = batch.turn_end[0].nonzero().squeeze(-1)
    assert ends.tolist() == [len(prompts[0]) + len(replies[0]), len(prompts[1]) + len(replies[1])]
    assert (ids[ends] == codec.stop_token_ids[0]).all()
    assert batch.token_rewards[0, ends].tolist() == [1.0, 2.0] and batch.token_rewards.sum() == 3.0
    # Images: one per turn, in order; the prompts are prefixes of the row (rollout context = update context).
    assert batch.images_per_row.tolist() == [2] and batch.vision.image_grid_thw.shape == (2, 3)
    assert all(torch.equal(ids[: len(p)], torch.tensor(p)) for p in prompts)
    assert batch.rollout_logprobs[0][loss].eq(-0.5).all() and batch.rollout_logprobs[0][~loss].eq(0).all()


def test_answer_span_masks_select_exactly_the_answer_tokens(codec):
    replies = [reply_ids(codec, "thinking hard", "Down")]
    assembler, prompts = play(codec, replies, spans=(["answer"], ["answer"]))
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    loss, ids = batch.loss_mask[0], batch.input_ids[0]
    answer_ids = encode(codec, "<answer>Down</answer>")
    assert (
        ids[loss].tolist() == answer_ids + codec.stop_token_ids
    )  # the end-of-turn token stays in both masks
    assert torch.equal(batch.adv_mask[0], loss)


def test_action_span_masks_the_tokens_of_the_action_name_not_the_tags(codec):
    replies = [reply_ids(codec, "thinking hard", "Down")]
    assembler, _ = play(codec, replies, spans=(["action"], ["action"]))
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    loss, ids = batch.loss_mask[0], batch.input_ids[0]
    selected = ids[loss].tolist()
    assert selected[-len(codec.stop_token_ids) :] == codec.stop_token_ids  # the turn end stays
    chosen = codec.tokenizer.decode(selected[: -len(codec.stop_token_ids)])
    # a token holding a tag character and the name's first (">Down") is in; the tags' own tokens are not
    assert "Down" in chosen and "answer" not in chosen and "think" not in chosen
    assert torch.equal(batch.adv_mask[0], loss)


def test_an_empty_reply_with_selected_spans_keeps_only_its_turn_end(codec):
    assembler, _ = play(codec, [[]], spans=(["action"], ["answer"]))  # the stop token alone
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    assert batch.input_ids[0][batch.loss_mask[0]].tolist() == codec.stop_token_ids
    assert torch.equal(batch.adv_mask[0], batch.loss_mask[0])


def test_think_span_excludes_answer_but_adv_keeps_turn_end(codec):
    replies = [reply_ids(codec, "plan", "Up")]
    assembler, _ = play(codec, replies, stopped=[False], spans=(["think"], ["think"]))
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    ids = batch.input_ids[0]
    assert ids[batch.loss_mask[0]].tolist() == encode(codec, "<think>plan</think>")
    # Cut by length: the turn end is the last sampled token, kept in adv_mask for turn-level credit.
    assert (
        ids[batch.adv_mask[0]].tolist()
        == encode(codec, "<think>plan</think>") + encode(codec, "</answer>")[-1:]
    )
    assert batch.turn_end[0].nonzero().item() == len(ids) - 1


def test_sampled_ids_kept_even_if_text_retokenises_differently(codec):
    # "Up" sampled one character at a time: decoding and re-encoding would merge it into fewer tokens.
    chars = [codec.tokenizer.convert_tokens_to_ids(c) for c in "<answer>Up</answer>"]
    assert encode(codec, codec.decode(chars)) != chars
    assembler, prompts = play(codec, [chars, chars])
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    assert batch.input_ids[0][batch.loss_mask[0]].tolist() == (chars + codec.stop_token_ids) * 2


def test_length_cut_reply_gets_template_end_of_turn_unmasked(codec):
    replies = [reply_ids(codec, "long", "Left"), reply_ids(codec, "b", "Up")]
    assembler, prompts = play(codec, replies, stopped=[False, True])
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    ids, loss = batch.input_ids[0], batch.loss_mask[0]
    first_end = len(prompts[0]) + len(replies[0]) - 1
    assert batch.turn_end[0].nonzero().squeeze(-1).tolist()[0] == first_end
    assert ids[first_end + 1] == codec.stop_token_ids[0] and not loss[first_end + 1]  # template's <|im_end|>
    assert loss.sum() == len(replies[0]) + len(replies[1]) + 1


def test_window_starts_a_new_row_whose_context_is_the_rollout_context(codec):
    replies = [reply_ids(codec, f"step {t}", "Up") for t in range(4)]
    assembler, prompts = play(codec, replies, window=1)
    segments = assembler.segments
    assert len(segments) == 2  # turns 0-2 in row 0; turn 3 drops turn 1 (turn 0 is pinned), so row 1 starts
    batch = build_batch([segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    rows = [batch.input_ids[r][batch.attention_mask[r].bool()] for r in range(2)]
    for t, row in ((1, 0), (2, 0), (3, 1)):
        assert torch.equal(rows[row][: len(prompts[t])], torch.tensor(prompts[t]))
    # Row 1 = [system, turn 0, turn 2, turn 3] rendered; only turn 3's reply is trained there.
    assert batch.token_turn[1][batch.loss_mask[1]].unique().tolist() == [3]
    assert batch.token_turn[0][batch.loss_mask[0]].unique().tolist() == [0, 1, 2]
    assert batch.images_per_row.tolist() == [3, 3] and len(batch.vision) == 6
    assert batch.turn_end.sum() == 4 and assembler.num_new_segments_by_template == 0
    text = codec.decode(rows[1].tolist())
    assert "Turn 0" in text and "Turn 1" not in text and "Turn 2" in text and "Turn 3" in text


def test_window_0_without_a_pinned_first_turn_holds_only_the_current_observation(codec):
    replies = [reply_ids(codec, f"step {t}", "Up") for t in range(3)]
    assembler, prompts = play(codec, replies, window=0, pin_first_turn=False)
    assert len(assembler.segments) == 3  # one row per turn
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    assert batch.images_per_row.tolist() == [1, 1, 1] and len(batch.vision) == 3
    for t, prompt in enumerate(prompts):
        text = codec.decode(prompt)
        assert "Push the box." in text and [f"Turn {u}" in text for u in range(3)] == [
            u == t for u in range(3)
        ]
        assert torch.equal(batch.input_ids[t][: len(prompt)], torch.tensor(prompt))
    assert batch.token_turn[2][batch.loss_mask[2]].unique().tolist() == [2]


def test_history_rewriting_template_falls_back_to_new_rows(processor):
    codec = ChatCodec(processor, HISTORY_REWRITING_TEMPLATE)
    replies = [reply_ids(codec, "secret", "Up") for _ in range(3)]
    assembler, prompts = play(codec, replies)
    assert len(assembler.segments) == 3 and assembler.num_new_segments_by_template == 2
    batch = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    for row, prompt in enumerate(prompts):
        assert torch.equal(batch.input_ids[row][: len(prompt)], torch.tensor(prompt))
        assert "secret" not in codec.decode(prompt)  # history without <think>, as the template renders it
    assert batch.loss_mask.sum() == 3 * (len(replies[0]) + 1)


def test_action_token_marks_the_token_where_the_executed_action_starts(codec):
    """The think text also says 'Down'; only the answer's action token is marked, and it is one of the
    action tokens the mpo update reads its policy at."""
    names = ("Up", "Down", "Left", "Right")
    tokens = action_token_ids(codec, names)
    assert len(set(tokens)) == 4
    assembler = EpisodeAssembler(codec, "Play.", None, False)
    assembler.commit(assembler.prepare("<image> Next?", [image(0)]))
    sampled = reply_ids(codec, "go Down", "Left") + codec.stop_token_ids
    reply = assembler.add_reply(sampled, [-0.5] * len(sampled), True)
    parse = parse_reply(reply, "free_think", names, 1)
    assembler.finish_turn(1.0, parse.spans, "all", "all", action_char=parse.action_starts[0])
    row = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    marked = row.action_token[0].nonzero().flatten().tolist()
    assert len(marked) == 1 and row.input_ids[0, marked[0]].item() == tokens[names.index("Left")]
    assert row.loss_mask[0, marked[0]] and row.token_turn[0, marked[0]] == 0


def marked_token(codec, names, sampled: list[int]) -> list[int]:
    """The ids marked as the turn's action token after one no_think reply `sampled`."""
    readout = action_readout(codec, names)
    assembler = EpisodeAssembler(codec, "Play.", None, False)
    assembler.commit(assembler.prepare("<image> Next?", [image(0)]))
    reply = assembler.add_reply(sampled, [-0.5] * len(sampled), True)
    parse = parse_reply(reply, "no_think", names, 1)
    chosen = readout.token_ids[names.index(parse.actions[0])]
    action_char = parse.action_starts[0] + readout.char_offset
    assembler.finish_turn(1.0, parse.spans, "all", "all", action_char, chosen)
    row = build_batch([assembler.segments], [EpisodeRecord(0, 0, 0, 0)], codec.pad_token_id)
    return row.input_ids[0][row.action_token[0]].tolist()


def test_actions_are_read_where_the_reply_chooses_them_even_when_tokenized_apart(codec):
    """The tiny tokenizer writes `>Left`, `>Right` but `>` + `F`... for Forward: the choice is the token
    after `<answer`, for all three, so Forward is read at `>` (not at `F`, one position later)."""
    names = ("Left", "Right", "Forward")
    tokens = action_token_ids(codec, names)
    assert [codec.decode([t]) for t in tokens] == [">Left", ">Right", ">"]
    for name, token in zip(names, tokens, strict=True):
        assert marked_token(
            codec, names, encode(codec, f"<answer>{name}</answer>") + codec.stop_token_ids
        ) == [token]
    spelled_apart = encode(codec, "<answer>") + encode(codec, "Left</answer>") + codec.stop_token_ids
    assert codec.decode(spelled_apart).startswith("<answer>Left</answer>")
    assert marked_token(codec, names, spelled_apart) == []  # `>` here chose Left, not Forward: not read


def test_action_tokens_must_be_distinct(codec):
    assert action_token_ids(codec, ("Down", "Downstairs"))  # told apart after `>Down`: `</` or `st`
    with pytest.raises(ValueError, match="not told apart"):
        action_token_ids(codec, ("Left", "Forward", "Pickup"))  # `>` starts both Forward and Pickup
