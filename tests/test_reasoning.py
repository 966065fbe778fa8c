"""The rule-based grounding / world-modeling matcher on hand-written replies."""

import pytest

from envs_visual.facts import facts_to_sentence
from vagen.config import EnvConfig
from vagen.rollout.reasoning import extract_facts, fact_f1, score_reasoning

TRUTH = [("box", "above"), ("box", "left"), ("target", "same row"), ("target", "right")]


def test_right_description_scores_one():
    assert fact_f1(facts_to_sentence(TRUTH), TRUTH) == 1.0
    assert fact_f1("Boxes: up and to the left. The target is east, in the same row.", TRUTH) == 1.0


def test_partly_right_description_scores_f1():
    # 2 stated facts, both true (precision 1), 2 of 4 found (recall 0.5): F1 = 2/3.
    assert fact_f1("The box is above and to the left of me.", TRUTH) == pytest.approx(2 / 3)
    # 3 stated, 1 true: P = 1/3, R = 1/4 -> F1 = 2/7.
    assert fact_f1("The box is below and left. The target is above.", TRUTH) == pytest.approx(2 / 7)


def test_wrong_empty_and_malformed_descriptions_score_zero():
    assert fact_f1("The hole is below the player.", TRUTH) == 0.0
    assert fact_f1("", TRUTH) == 0.0
    assert fact_f1(None, TRUTH) == 0.0  # the tag was missing
    assert fact_f1("<<>>!! ###", TRUTH) == 0.0
    assert fact_f1("", []) == 1.0  # nothing to describe, nothing described


def test_relation_attaches_to_nearest_object_in_its_sentence():
    text = "Above the player is a box, and the hole is to the right. Goal: down"
    assert extract_facts(text) == {("box", "above"), ("hole", "right"), ("goal", "below")}


def test_score_reasoning_weights_and_anti_template_penalty():
    cfg = EnvConfig(
        prompt_format="grounding_worldmodeling",
        grounding_reward_weight=0.5,
        worldmodel_reward_weight=2.0,
    )  # a repeated description scoring below 0.5 costs 0.1 (TEMPLATE_PENALTY, TEMPLATE_SCORE_THRESHOLD)
    after = [("box", "above"), ("box", "same column")]
    texts = {"observation": facts_to_sentence(TRUTH), "prediction": "The box is above the player."}
    seen: set[str] = set()
    score = score_reasoning(texts, TRUTH, after, cfg, seen)
    assert (score.grounding, score.worldmodel, score.penalty) == (1.0, pytest.approx(2 / 3), 0.0)
    assert score.reward == pytest.approx(0.5 + 2.0 * 2 / 3)
    # Repeating descriptions that score at least the threshold (1 and 2/3 >= 0.5) costs nothing.
    assert score_reasoning(texts, TRUTH, after, cfg, seen).penalty == 0.0
    wrong = {"observation": "The box is below.", "prediction": "Nothing."}
    assert score_reasoning(wrong, TRUTH, after, cfg, seen).penalty == 0.0  # first time
    repeated = score_reasoning(
        {"observation": "the box is BELOW", "prediction": "nothing"}, TRUTH, after, cfg, seen
    )
    assert repeated.penalty == pytest.approx(0.2) and repeated.reward == pytest.approx(-0.2)


def test_formats_without_the_tag_score_none():
    cfg = EnvConfig(prompt_format="free_think", grounding_reward_weight=1.0)
    score = score_reasoning({"think": "box above"}, TRUTH, TRUTH, cfg, set())
    assert score.grounding is None and score.worldmodel is None and score.reward == 0.0
