"""The language layer: a language model plays a grid env by replying with tagged text.

Reply formats (PROMPT_FORMATS), leading/trailing whitespace allowed, whitespace between elements:
  no_think                 <answer>A</answer>
  free_think               <think>...</think><answer>A</answer>
  grounding                <think><observation>.</observation><reasoning>.</reasoning></think><answer>..
  worldmodeling            <think><reasoning>.</reasoning><prediction>.</prediction></think><answer>A</answer>
  grounding_worldmodeling  <think> observation, reasoning, prediction elements </think><answer>A</answer>
A is a list of action names separated by "," (or "||"), case-insensitive. Actions run only when the
tag structure is right (as in VAGEN/RAGEN); of those, the ones before the first invalid name run, up to
`max_actions_per_turn`; the rest are dropped and counted. The format reward is paid only when the
structure is right and every action is valid and within the cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np

from envs_visual.facts import Fact, facts_to_sentence

IMAGE_PLACEHOLDER = "<image>"
TAGS = ("think", "observation", "reasoning", "prediction", "answer")
SPAN_NAMES = (*TAGS, "action")  # ParseResult.spans: each tag's element, and the answer's inner text
ACTION_SEPARATOR = re.compile(r",|\|\|")
# Free text inside an element: anything that is not one of our tags (so nested or stray tags fail).
_FREE_TEXT = r"(?:(?!</?(?:" + "|".join(TAGS) + r")>).)*"

INSTRUCTION_STYLES = ("full", "brief")
SYSTEM_PROMPT = (
    "You are an agent playing a game on a grid. Each turn you see the current state and reply with "
    "your next actions in exactly the requested format."
)


@dataclass(frozen=True)
class PromptFormat:
    """think_parts: None = no <think>; () = free text in <think>; else the sub-elements in order."""

    think_parts: tuple[str, ...] | None
    instruction: str


PROMPT_FORMATS = {
    "no_think": PromptFormat(None, "Reply only with your actions inside <answer></answer>."),
    "free_think": PromptFormat(
        (),
        "First think step by step inside <think></think>, then give your actions inside <answer></answer>.",
    ),
    "grounding": PromptFormat(
        ("observation", "reasoning"),
        "Inside <think></think>, first describe where the objects are relative to you in "
        "<observation></observation>, then reason in <reasoning></reasoning>. "
        "Then give your actions inside <answer></answer>.",
    ),
    "worldmodeling": PromptFormat(
        ("reasoning", "prediction"),
        "Inside <think></think>, first reason in <reasoning></reasoning>, then predict where the objects "
        "will be relative to you after your actions in <prediction></prediction>. "
        "Then give your actions inside <answer></answer>.",
    ),
    "grounding_worldmodeling": PromptFormat(
        ("observation", "reasoning", "prediction"),
        "Inside <think></think>, first describe where the objects are relative to you in "
        "<observation></observation>, then reason in <reasoning></reasoning>, then predict where the "
        "objects will be relative to you after your actions in <prediction></prediction>. "
        "Then give your actions inside <answer></answer>.",
    ),
}


@dataclass
class Observation:
    text: str  # message text; each image is marked by IMAGE_PLACEHOLDER
    images: list[np.ndarray]  # uint8 (H, W, 3), one per placeholder, in order (empty in text mode)
    state: str  # the env's text grid of the current state, shown or not: an exact key of the state
    features: np.ndarray | None = None  # the env's state_features() one-hots, if it has them (never shown)


@dataclass
class ParseResult:
    format_ok: bool  # tags of the chosen format present, well formed, >= 1 action, all valid
    actions: list[str]  # canonical names of the valid actions before the first invalid one
    num_invalid: int  # actions dropped (invalid, after an invalid one, or over the per-turn cap)
    texts: dict[str, str] = field(default_factory=dict)  # tag -> inner text
    # tag -> [start, end) of the element, tags included; "action": the answer's inner text alone
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    action_starts: list[int] = field(default_factory=list)  # reply offset of each of `actions`' names


def _element(tag: str, inner: str) -> str:
    return rf"(?P<{tag}><{tag}>(?P<{tag}_text>{inner})</{tag}>)"


def _reply_pattern(prompt_format: PromptFormat) -> re.Pattern:
    parts = []
    if prompt_format.think_parts is not None:
        if prompt_format.think_parts:
            inner = (
                r"\s*" + r"\s*".join(_element(tag, _FREE_TEXT) for tag in prompt_format.think_parts) + r"\s*"
            )
        else:
            inner = _FREE_TEXT
        parts.append(_element("think", inner))
    parts.append(_element("answer", _FREE_TEXT))
    return re.compile(r"\s*" + r"\s*".join(parts) + r"\s*", re.DOTALL)


_PATTERNS = {name: _reply_pattern(spec) for name, spec in PROMPT_FORMATS.items()}


def parse_reply(
    reply: str, prompt_format: str, action_names: tuple[str, ...], max_actions: int
) -> ParseResult:
    """Parse one reply; never raises on any string."""
    match = _PATTERNS[prompt_format].fullmatch(reply)
    if match is None:
        return ParseResult(format_ok=False, actions=[], num_invalid=0)
    texts = {tag: match.group(f"{tag}_text") for tag in TAGS if tag in match.re.groupindex}
    spans = {tag: match.span(tag) for tag in texts}
    spans["action"] = match.span("answer_text")  # the answer without its tags: the tokens that decide
    canonical = {name.lower(): name for name in action_names}
    answer, answer_start = texts["answer"], match.start("answer_text")
    bounds = [0] + [x for sep in ACTION_SEPARATOR.finditer(answer) for x in sep.span()] + [len(answer)]
    items = []  # (stripped item, its offset in the reply)
    for begin, end in zip(bounds[::2], bounds[1::2], strict=True):
        piece = answer[begin:end]
        if piece.strip():
            items.append((piece.strip(), answer_start + begin + len(piece) - len(piece.lstrip())))
    actions, action_starts = [], []
    for item, start in items[:max_actions]:
        if item.lower() not in canonical:
            break
        actions.append(canonical[item.lower()])
        action_starts.append(start)
    num_invalid = len(items) - len(actions)
    return ParseResult(len(items) > 0 and num_invalid == 0, actions, num_invalid, texts, spans, action_starts)


def separate_cells(grid: str, separator: str) -> str:
    """The text grid with `separator` between the cells of each row ("P F F" for "PFF" with " "): a BPE
    tokenizer then keeps one token per cell instead of merging runs like "FFFH" that hide the columns."""
    return "\n".join(separator.join(row) for row in grid.split("\n"))


class LanguageEnv:
    """Wraps an envs_visual env for a language model: messages in, tagged replies out.

    Reward per turn = sum of the env rewards of the executed actions + `format_reward` if format_ok,
    + `format_penalty` (zero or negative; RAGEN uses -0.1) if not.
    The episode ends when the env terminates or truncates.

    The task instructions (rules, legend, actions, reply format, an example) open the first message, or,
    with `instructions_in_system`, close the system prompt: every message is then just an observation,
    and a context that drops earlier turns (rollout.window) still holds the whole task. Each later
    message opens with what the last reply did ("Executed actions: Up."), unless `action_feedback` is
    False: then it is the current observation alone, as the first one is.
    """

    def __init__(
        self,
        env: gymnasium.Env,
        prompt_format: str = "free_think",
        max_actions_per_turn: int = 3,
        format_reward: float = 0.5,
        text_only: bool = False,
        format_penalty: float = 0.0,
        cell_separator: str = "",
        instructions_in_system: bool = False,
        instructions: str = "full",
        action_feedback: bool = True,
    ):
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {sorted(PROMPT_FORMATS)}, got {prompt_format!r}")
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
        if instructions not in INSTRUCTION_STYLES:
            raise ValueError(f"instructions must be one of {INSTRUCTION_STYLES}, got {instructions!r}")
        if format_penalty > 0:
            raise ValueError(
                f"format_penalty is added to a malformed turn's reward: use <= 0, got {format_penalty}"
            )
        self.env = env
        self.prompt_format = prompt_format
        self.max_actions_per_turn = max_actions_per_turn
        self.format_reward = format_reward
        self.format_penalty = format_penalty
        self.text_only = text_only
        self.cell_separator = cell_separator
        self.action_names: tuple[str, ...] = tuple(env.unwrapped.action_names)
        self.instructions_in_system = instructions_in_system
        self.instruction_style = instructions
        self.action_feedback = action_feedback
        in_system = (
            self.instructions() if instructions == "brief" else f"{SYSTEM_PROMPT}\n\n{self.instructions()}"
        )
        self.system_prompt = in_system if instructions_in_system else SYSTEM_PROMPT
        self._last_obs: dict[str, Any] = {}
        self._last_info: dict[str, Any] = {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._last_obs, self._last_info = obs, info
        lines = [] if self.instructions_in_system else [self.instructions()]
        lines.append(f"Current observation:\n{self._placeholder(obs)}")
        return Observation("\n".join(lines), self._images(obs), obs["text"], self._features()), info

    def instructions(self) -> str:
        """The task: the game's rules and legend, the actions, the reply format and an example (or, brief,
        the game's first sentence, the actions and the reply format)."""
        game = self.env.unwrapped
        if self.instruction_style == "brief":
            first_sentence = game.instruction.split(". ")[0].rstrip(".")
            actions = f"Actions: {', '.join(self.action_names)}."
            return f"{first_sentence}. {actions} {PROMPT_FORMATS[self.prompt_format].instruction}"
        legend = game.text_legend if self.text_only else game.image_legend
        lines = [
            game.instruction,
            legend,
            f"Actions: {', '.join(self.action_names)}. {self._actions_per_turn_rule()}",
            PROMPT_FORMATS[self.prompt_format].instruction,
            f"Example reply:\n{self.example_reply()}",
        ]
        return "\n".join(lines)

    def parse(self, reply: str) -> ParseResult:
        return parse_reply(reply, self.prompt_format, self.action_names, self.max_actions_per_turn)

    def planned_actions(self, reply: str) -> list[int]:
        """The game actions `step(reply)` plays, in order, unless one of them ends the episode first."""
        return [self.action_names.index(name) for name in self.parse(reply).actions]

    def step(self, reply: str):
        parse = self.parse(reply)
        facts_before = self.state_facts()
        reward, terminated, truncated, effective = 0.0, False, False, False
        executed: list[str] = []
        for name in parse.actions:
            obs, env_reward, terminated, truncated, env_info = self.env.step(self.action_names.index(name))
            self._last_obs, self._last_info = obs, env_info
            executed.append(name)
            reward += float(env_reward)
            effective = effective or bool(env_info.get("action_is_effective", False))
            if terminated or truncated:
                break
        reward += self.format_reward if parse.format_ok else self.format_penalty
        info = {
            **self._last_info,  # the env info of the last executed step (of the reset if none ran)
            "action_is_effective": effective,
            "success": bool(self._last_info.get("success", False)),
            "parse": parse,
            "actions_executed": executed,
            "num_invalid": parse.num_invalid,
            "format_ok": parse.format_ok,
            "state_facts_before": facts_before,
            "state_facts_after": self.state_facts(),
        }
        return self._turn_message(executed, parse), reward, terminated, truncated, info

    def _actions_per_turn_rule(self) -> str:
        if self.max_actions_per_turn == 1:
            return "Give exactly 1 action per turn."
        limit = self.max_actions_per_turn
        return f"Give 1 to {limit} actions per turn, separated by commas; they run in order."

    def example_reply(self) -> str:
        """A well-formed reply in the chosen format (game-neutral content)."""
        facts: list[Fact] = list(getattr(self.env.unwrapped, "example_facts", []))
        sentence = facts_to_sentence(facts) or "I see where the objects are."
        contents = {
            "observation": sentence,
            "reasoning": "Moving this way brings me closer to my goal.",
            "prediction": sentence,
        }
        example_actions = self.action_names[1 : 1 + min(2, self.max_actions_per_turn)]
        answer = f"<answer>{', '.join(example_actions)}</answer>"
        think_parts = PROMPT_FORMATS[self.prompt_format].think_parts
        if think_parts is None:
            return answer
        if not think_parts:
            return f"<think>{contents['reasoning']}</think>{answer}"
        inner = "".join(f"<{tag}>{contents[tag]}</{tag}>" for tag in think_parts)
        return f"<think>{inner}</think>{answer}"

    def _turn_message(self, executed: list[str], parse: ParseResult) -> Observation:
        lines = self._feedback(executed, parse) if self.action_feedback else []
        lines.append(f"Current observation:\n{self._placeholder(self._last_obs)}")
        return Observation(
            "\n".join(lines), self._images(self._last_obs), self._last_obs["text"], self._features()
        )

    @staticmethod
    def _feedback(executed: list[str], parse: ParseResult) -> list[str]:
        """What the last reply did: the actions executed, or why none ran; then any ignored ones."""
        if executed:
            lines = [f"Executed actions: {', '.join(executed)}."]
        elif parse.texts:
            lines = ["No action was executed: the answer held no valid action."]
        else:
            lines = ["No action was executed: the reply did not follow the required format."]
        if parse.num_invalid:
            lines.append(f"{parse.num_invalid} invalid or extra action(s) were ignored.")
        return lines

    def state_facts(self) -> list[Fact]:
        """The env's `describe_state()`, or [] for an env without facts (then grounding scores nothing)."""
        describe_state = getattr(self.env.unwrapped, "describe_state", None)
        return [] if describe_state is None else list(describe_state())

    def _features(self) -> np.ndarray | None:
        state_features = getattr(self.env.unwrapped, "state_features", None)
        return None if state_features is None else state_features()

    def _placeholder(self, obs: dict[str, Any]) -> str:
        return separate_cells(obs["text"], self.cell_separator) if self.text_only else IMAGE_PLACEHOLDER

    def _images(self, obs: dict[str, Any]) -> list[np.ndarray]:
        return [] if self.text_only else [obs["image"]]
