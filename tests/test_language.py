"""The language layer: reply parsing (incl. fuzzing), turn rewards, messages, state facts."""

import gymnasium
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs_visual.minigrid  # registers the envs
from envs_visual.facts import OBJECTS, RELATION_PHRASES, RELATIONS, facts_to_sentence
from envs_visual.language import IMAGE_PLACEHOLDER, PROMPT_FORMATS, TAGS, LanguageEnv, parse_reply

ACTIONS = ("Up", "Down", "Left", "Right")
LEVEL = "######\n#    #\n# @$.#\n#    #\n######"  # Right solves it


def sokoban(prompt_format="free_think", **kwargs) -> LanguageEnv:
    env = gymnasium.make("envs_visual/Sokoban-v0", dim_room=(5, 6))
    lang = LanguageEnv(env, prompt_format=prompt_format, **kwargs)
    lang.reset(seed=0, options={"level": LEVEL})
    return lang


def parse(reply, prompt_format="free_think", max_actions=3):
    return parse_reply(reply, prompt_format, ACTIONS, max_actions)


def test_free_think_texts_and_whole_element_spans():
    reply = "  <think>go left\n</think> <answer>left, UP || Down</answer>\n"
    result = parse(reply)
    assert result.format_ok and result.actions == ["Left", "Up", "Down"] and result.num_invalid == 0
    assert result.texts == {"think": "go left\n", "answer": "left, UP || Down"}
    assert reply[slice(*result.spans["think"])] == "<think>go left\n</think>"
    assert reply[slice(*result.spans["answer"])] == "<answer>left, UP || Down</answer>"
    assert reply[slice(*result.spans["action"])] == "left, UP || Down"  # the answer without its tags


def test_grounding_worldmodeling_nested_spans():
    reply = (
        "<think><observation>box left</observation> <reasoning>push</reasoning>"
        "<prediction>box on target</prediction></think><answer>Left</answer>"
    )
    result = parse(reply, "grounding_worldmodeling")
    assert result.format_ok and result.actions == ["Left"]
    for tag in TAGS:
        start, end = result.spans[tag]
        assert reply[start:end].startswith(f"<{tag}>") and reply[start:end].endswith(f"</{tag}>")
    assert result.texts["observation"] == "box left" and result.texts["prediction"] == "box on target"


@pytest.mark.parametrize(
    ("reply", "prompt_format"),
    [
        ("<answer>Up</answer>", "free_think"),  # think missing
        ("<think>a</think><answer>Up</answer>", "no_think"),  # think not allowed
        ("<think>a</think><answer>Up</answer>", "grounding"),  # sub-elements missing
        (
            "<think><reasoning>a</reasoning><observation>b</observation></think><answer>Up</answer>",
            "grounding",
        ),
        ("<think>a<think>b</think></think><answer>Up</answer>", "free_think"),  # nested
        ("<think>a</think><answer>Up", "free_think"),  # unclosed
        ("Sure! <think>a</think><answer>Up</answer>", "free_think"),  # text outside
        ("<think>a</think><answer>Up</answer><answer>Up</answer>", "free_think"),
    ],
)
def test_malformed_structure_runs_no_action(reply, prompt_format):
    result = parse(reply, prompt_format)
    assert not result.format_ok and result.actions == [] and result.num_invalid == 0


def test_actions_before_first_invalid_run_and_the_rest_count():
    result = parse("<think></think><answer>Up, jump, Left</answer>")
    assert not result.format_ok and result.actions == ["Up"] and result.num_invalid == 2
    result = parse("<think></think><answer>Up, Left, Down, Right</answer>", max_actions=3)
    assert not result.format_ok and result.actions == ["Up", "Left", "Down"] and result.num_invalid == 1
    result = parse("<think></think><answer> , </answer>")
    assert not result.format_ok and result.actions == [] and result.num_invalid == 0


def test_turn_reward_is_env_reward_plus_format_reward():
    lang = sokoban(format_reward=0.5)
    obs, reward, terminated, truncated, info = lang.step("<think>push</think><answer>Right</answer>")
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0 + 0.5) and terminated and not truncated
    assert info["success"] and info["actions_executed"] == ["Right"] and info["format_ok"]
    assert info["state_facts_before"] == [
        ("box", "same row"),
        ("box", "right"),
        ("target", "same row"),
        ("target", "right"),
    ]


def test_stops_at_termination_and_bad_format_gets_no_bonus():
    lang = sokoban()
    _, reward, terminated, _, info = lang.step("<think>x</think><answer>Right, Left, jump</answer>")
    assert terminated and info["actions_executed"] == ["Right"] and info["num_invalid"] == 1
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0)
    lang = sokoban()
    obs, reward, terminated, _, info = lang.step("<answer>Right</answer>")
    assert reward == 0 and not terminated and info["actions_executed"] == [] and "did not follow" in obs.text
    assert info["optimal_steps"] == 1 and not info["success"]  # env info of the reset


def test_malformed_reply_pays_the_format_penalty_and_a_wellformed_one_does_not():
    lang = sokoban(format_reward=0.0, format_penalty=-0.25)
    _, reward, terminated, _, _ = lang.step("Right")  # no tags: nothing runs, the penalty is paid
    assert reward == pytest.approx(-0.25) and not terminated
    _, reward, _, _, _ = lang.step("<think>push</think><answer>Right</answer>")
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0)
    with pytest.raises(ValueError, match="format_penalty"):
        sokoban(format_penalty=0.1)


def test_truncation_ends_the_episode():
    env = gymnasium.make("envs_visual/Sokoban-v0", dim_room=(5, 6), max_steps=2)
    lang = LanguageEnv(env, prompt_format="no_think")
    lang.reset(options={"level": LEVEL})
    _, _, terminated, truncated, info = lang.step("<answer>Up, Down, Up</answer>")
    assert truncated and not terminated and info["actions_executed"] == ["Up", "Down"]


@pytest.mark.parametrize("prompt_format", sorted(PROMPT_FORMATS))
def test_first_message_and_example_for_every_format(prompt_format):
    lang = sokoban(prompt_format)
    obs, _ = lang.reset(seed=0, options={"level": LEVEL})
    assert obs.text.count(IMAGE_PLACEHOLDER) == len(obs.images) == 1 and obs.images[0].shape == (140, 168, 3)
    assert "Up, Down, Left, Right" in obs.text and lang.example_reply() in obs.text
    assert "red rings are targets" in obs.text and lang.system_prompt
    assert parse(lang.example_reply(), prompt_format).format_ok


def test_instructions_in_system_leave_every_message_an_observation():
    first = sokoban("free_think")
    obs, _ = first.reset(seed=0, options={"level": LEVEL})
    lang = sokoban("free_think", instructions_in_system=True)
    moved, _ = lang.reset(seed=0, options={"level": LEVEL})
    assert lang.system_prompt == f"{first.system_prompt}\n\n{first.instructions()}"
    assert moved.text == f"Current observation:\n{IMAGE_PLACEHOLDER}"
    assert obs.text == f"{first.instructions()}\n{moved.text}"
    assert np.array_equal(obs.images[0], moved.images[0])


def test_brief_instructions_are_one_sentence_and_the_whole_system_prompt():
    lang = sokoban("no_think", instructions_in_system=True, instructions="brief")
    obs, _ = lang.reset(seed=0, options={"level": LEVEL})
    assert lang.system_prompt == (
        "You are playing Sokoban. Actions: Up, Down, Left, Right. "
        "Reply only with your actions inside <answer></answer>."
    )
    assert obs.text == f"Current observation:\n{IMAGE_PLACEHOLDER}"
    in_message = sokoban("no_think", instructions="brief")
    first, _ = in_message.reset(seed=0, options={"level": LEVEL})
    assert first.text.startswith(lang.system_prompt) and in_message.system_prompt != lang.system_prompt
    with pytest.raises(ValueError, match="instructions must be one of"):
        sokoban("no_think", instructions="terse")


@pytest.mark.parametrize(
    ("reply", "prompt_format", "starts"),
    [
        ("<answer>Down</answer>", "no_think", [8]),
        ("  <answer> left , Up</answer>", "no_think", [11, 18]),
        ("<answer>Up||Right</answer>", "no_think", [8, 12]),
        ("<answer>Up|| down ,Left</answer>", "no_think", [8, 13, 19]),
        ("<think>go Down</think><answer>Right, Jump, Down</answer>", "free_think", [30]),
    ],
)
def test_action_starts_point_at_each_valid_action_name(reply, prompt_format, starts):
    parsed = parse_reply(reply, prompt_format, ("Up", "Down", "Left", "Right"), max_actions=3)
    assert parsed.action_starts == starts
    assert [reply[s : s + len(a)].lower() for s, a in zip(starts, parsed.actions, strict=True)] == [
        a.lower() for a in parsed.actions
    ]


def test_text_mode_replaces_the_image_by_the_grid():
    lang = sokoban("no_think", text_only=True)
    obs, _ = lang.reset(options={"level": LEVEL})
    assert (
        obs.images == [] and LEVEL in obs.text and "'$' box" in obs.text and IMAGE_PLACEHOLDER not in obs.text
    )
    obs, *_ = lang.step("<answer>Up, Fly</answer>")
    assert "Executed actions: Up." in obs.text and "1 invalid" in obs.text
    assert "######\n# @  #\n#  $.#" in obs.text and obs.images == []


def test_without_action_feedback_every_message_is_the_observation_alone():
    lang = sokoban("no_think", instructions_in_system=True, action_feedback=False)
    first, _ = lang.reset(options={"level": LEVEL})
    assert first.text == f"Current observation:\n{IMAGE_PLACEHOLDER}"
    for reply in ("<answer>Up, Fly</answer>", "no tags at all"):  # one executed and one ignored, a malformed
        obs, *_ = lang.step(reply)
        assert obs.text == first.text
    assert obs.state == "######\n# @  #\n#  $.#\n#    #\n######"
    assert (
        obs.features.shape == (4 * 5 * 6,) and obs.features[3 * 30 + 1 * 6 + 2] == 1.0
    )  # the player's plane


def test_cell_separator_spaces_the_shown_grid_not_the_state_key():
    lang = LanguageEnv(
        gymnasium.make("envs_visual/FrozenLake-v0"), "no_think", 1, text_only=True, cell_separator=" "
    )
    obs, _ = lang.reset(options={"map": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    assert "P F F F\nF H F H\nF F F H\nH F F G" in obs.text
    assert obs.state == "PFFF\nFHFH\nFFFH\nHFFG"
    obs, *_ = lang.step("<answer>Right</answer>")
    assert "S P F F\nF H F H" in obs.text and obs.state.startswith("SPFF\n")


def test_observation_state_is_the_grid_whatever_the_path_and_the_mode():
    """Observation.state keys the env state: back at the start after Down, Up it equals the first
    observation's, whose message text differs; and it is the same with or without images."""
    for text_only in (False, True):
        lang = sokoban("no_think", text_only=text_only)
        start, _ = lang.reset(options={"level": LEVEL})
        assert start.state == LEVEL
        down, *_ = lang.step("<answer>Down</answer>")
        assert down.state == LEVEL.replace("# @$.#\n#    #", "#  $.#\n# @  #")
        back, *_ = lang.step("<answer>Up</answer>")
        assert back.state == LEVEL and back.text != start.text


def test_frozenlake_language_env():
    env = gymnasium.make("envs_visual/FrozenLake-v0", is_slippery=True)
    lang = LanguageEnv(env, prompt_format="grounding")
    obs, _ = lang.reset(seed=3)
    assert "slippery" in obs.text and "goal" in lang.example_reply()
    _, _, _, _, info = lang.step(lang.example_reply())
    assert info["format_ok"] and len(info["actions_executed"]) >= 1


def test_fact_sentences_use_the_vocabulary():
    assert set(RELATION_PHRASES) == set(RELATIONS) and "box" in OBJECTS
    sentence = facts_to_sentence([("box", "above"), ("box", "left"), ("hole", "right")])
    expected = "The box is above the player and to the left of the player. "
    assert sentence == expected + "The hole is to the right of the player."


SPECIAL = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "<observation>",
        "</reasoning>",
        "<prediction>",
        "<|im_end|>",
        "<|im_start|>",
        "<|vision_start|>",
        "<|image_pad|>",
        "<|endoftext|>",
        "Up",
        "left",
        ",",
        "||",
    ]
)
REPLIES = st.lists(st.one_of(st.text(max_size=20), SPECIAL), max_size=30).map("".join)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(reply=REPLIES, prompt_format=st.sampled_from(sorted(PROMPT_FORMATS)))
def test_parser_never_raises_and_spans_are_consistent(reply, prompt_format):
    result = parse(reply, prompt_format)
    assert len(result.actions) <= 3 and result.num_invalid >= 0
    assert all(action in ACTIONS for action in result.actions)
    for tag, (start, end) in result.spans.items():
        if tag == "action":  # the answer's inner text, which may be empty
            assert reply[start:end] == result.texts["answer"]
        else:
            assert 0 <= start < end <= len(reply) and result.texts[tag] in reply[start:end]
    assert result.format_ok <= (result.num_invalid == 0 and len(result.actions) >= 1)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(reply=REPLIES)
def test_step_never_raises_on_any_reply(reply):
    lang = sokoban("grounding_worldmodeling")
    obs, reward, *_ = lang.step(reply)
    assert np.isfinite(reward) and obs.text.count(IMAGE_PLACEHOLDER) == len(obs.images)


def test_huge_replies():
    lang = sokoban()
    for reply in [
        "x" * 100_000,
        "<think>" * 20_000,
        "<think>" + "a" * 100_000 + "</think><answer>Right</answer>",
    ]:
        *_, info = lang.step(reply)
    assert info["format_ok"] and info["success"]


def test_an_env_without_facts_reports_none_and_still_plays():
    """describe_state is optional (envs_visual.contract): without it the step info carries no facts."""

    class Factless(envs_visual.minigrid.MiniGridEnv):
        describe_state = property(lambda self: self.missing)  # reading it raises AttributeError

    lang = LanguageEnv(Factless(), prompt_format="grounding")
    lang.reset(seed=3)
    _, _, _, _, info = lang.step(lang.example_reply())
    assert info["format_ok"] and info["actions_executed"] == ["Right", "Forward"]
    assert info["state_facts_before"] == info["state_facts_after"] == []
