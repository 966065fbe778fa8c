"""Rule-based reasoning rewards: does the reply describe the state (grounding) and predict the next one
(world modeling) correctly? No LLM judge: an F1 over (object, relation) facts.

The env states the truth as facts relative to the player, e.g. ("box", "above"), ("target", "same row")
(`describe_state()`, reported as `state_facts_before` / `state_facts_after` in the step info). The reply's
`<observation>` / `<prediction>` text is read into facts with the env's vocabulary (envs_visual.facts):
each sentence is scanned left to right; a relation phrase attaches to the nearest object mentioned
before it in the sentence (or, if none, the first one after it), so "the box is above and to the left,
and the hole is below" gives {(box, above), (box, left), (hole, below)}. Synonyms (up/over -> above,
...) and plurals map to one canonical name.
Score = F1 = 2PR / (P + R) over the two fact sets (1 when both are empty).
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from envs_visual import facts
from vagen.config import EnvConfig

Fact = tuple[str, str]

# Extra compass words on top of the env's own vocabulary (envs_visual.facts).
EXTRA_RELATION_WORDS = {"north": "above", "south": "below", "west": "left", "east": "right"}
OBJECT_OF = {**{name: name for name in facts.OBJECTS}, **facts.OBJECT_SYNONYMS}
RELATION_OF = {
    **{name: name for name in facts.RELATIONS},
    **{phrase: name for name, phrase in facts.RELATION_PHRASES.items()},
    **facts.RELATION_SYNONYMS,
    **EXTRA_RELATION_WORDS,
}
SENTENCE_SPLIT = re.compile(r"[.;!?\n]+")
# A description repeated word for word within an episode while scoring below TEMPLATE_SCORE_THRESHOLD
# (F1) costs TEMPLATE_PENALTY: a template pasted turn after turn earns no grounding reward.
TEMPLATE_PENALTY = 0.1
TEMPLATE_SCORE_THRESHOLD = 0.5


def _pattern(phrases: Iterable[str]) -> re.Pattern[str]:
    """Whole-word alternation, longest phrase first so "same row" beats "row"."""
    ordered = sorted(set(phrases), key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(re.escape(p) for p in ordered) + r")\b")


OBJECT_PATTERN = _pattern(OBJECT_OF)
RELATION_PATTERN = _pattern(RELATION_OF)


def canonical_fact(fact: Iterable[str]) -> Fact:
    """Lower-case the env's fact and map synonyms to canonical names (unknown words stay as they are)."""
    obj, rel = (str(x).strip().lower() for x in fact)
    return OBJECT_OF.get(obj, obj), RELATION_OF.get(rel, rel)


def extract_facts(text: str) -> set[Fact]:
    """(object, relation) facts stated in free text, by the clause rule in the module docstring."""
    facts: set[Fact] = set()
    for clause in SENTENCE_SPLIT.split(text.lower()):
        mentions = [(m.start(), "object", OBJECT_OF[m.group(1)]) for m in OBJECT_PATTERN.finditer(clause)]
        mentions += [
            (m.start(), "relation", RELATION_OF[m.group(1)]) for m in RELATION_PATTERN.finditer(clause)
        ]
        mentions.sort()
        objects = [name for _, kind, name in mentions if kind == "object"]
        current = objects[0] if objects else None
        for _, kind, name in mentions:
            if kind == "object":
                current = name
            elif current is not None:
                facts.add((current, name))
    return facts


def fact_f1(text: str | None, truth: Iterable[Iterable[str]]) -> float:
    """F1 of the facts in `text` against the true facts; a missing text scores 0."""
    if text is None:
        return 0.0
    predicted = extract_facts(text)
    true = {canonical_fact(f) for f in truth}
    if not predicted and not true:
        return 1.0
    hits = len(predicted & true)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(true)
    return 2 * precision * recall / (precision + recall)


@dataclass
class ReasoningScore:
    """Reasoning part of one turn's reward (scores are None when the format has no such tag)."""

    grounding: float | None
    worldmodel: float | None
    penalty: float
    reward: float


def _normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z]+", text.lower()))


def score_reasoning(
    texts: dict[str, str],
    facts_before: Iterable[Iterable[str]],
    facts_after: Iterable[Iterable[str]],
    cfg: EnvConfig,
    seen_descriptions: set[str],
) -> ReasoningScore:
    """Grounding (<observation> vs facts before the step) and world modeling (<prediction> vs after).

    reward = w_g * F1_obs + w_w * F1_pred - penalty. The penalty (TEMPLATE_PENALTY) applies once per
    description that repeats, word for word, one given earlier in the episode while scoring below
    TEMPLATE_SCORE_THRESHOLD (only for tags whose weight is non-zero). `seen_descriptions` is the
    episode's memory and is updated here. Tags the prompt format never asks for score None and
    contribute nothing.
    """
    asks_grounding = "grounding" in cfg.prompt_format
    asks_worldmodel = "worldmodeling" in cfg.prompt_format
    grounding = fact_f1(texts.get("observation"), facts_before) if asks_grounding else None
    worldmodel = fact_f1(texts.get("prediction"), facts_after) if asks_worldmodel else None
    penalty = 0.0
    weighted = (
        ("observation", grounding, cfg.grounding_reward_weight),
        ("prediction", worldmodel, cfg.worldmodel_reward_weight),
    )
    for tag, score, weight in weighted:
        if score is None or weight == 0 or not texts.get(tag):
            continue
        key = f"{tag}:{_normalized(texts[tag])}"
        if key in seen_descriptions and score < TEMPLATE_SCORE_THRESHOLD:
            penalty += TEMPLATE_PENALTY
        seen_descriptions.add(key)
    reward = cfg.grounding_reward_weight * (grounding or 0.0) + cfg.worldmodel_reward_weight * (
        worldmodel or 0.0
    )
    return ReasoningScore(
        grounding=grounding, worldmodel=worldmodel, penalty=penalty, reward=reward - penalty
    )
