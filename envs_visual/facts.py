"""The vocabulary of state facts: (object, relation) pairs relative to the player.

`env.unwrapped.describe_state()` returns such facts; `facts_to_sentence` renders them as English
(used for warm-start data), and the rollout's rule-based matcher parses model text back into facts
with the constants below.

Relations of an object at (row, col) to the player at (p_row, p_col):
  vertical:   "above" (row < p_row), "below" (row > p_row), "same row" (row == p_row)
  horizontal: "left" (col < p_col), "right" (col > p_col), "same column" (col == p_col)
Sokoban reports both relations of every box and every target (a box on a target counts as both).
FrozenLake reports both relations of the goal, and holes only when directly next to the player,
with the one relation naming the side ("above", "below", "left", "right"). MiniGrid reports the goal,
key and door like the goal, and lava like the holes.
"""

from __future__ import annotations

from collections.abc import Iterable

OBJECTS = ("box", "target", "hole", "goal", "lava", "key", "door")
RELATIONS = ("above", "below", "left", "right", "same row", "same column")

# Phrase of each relation in `facts_to_sentence`.
RELATION_PHRASES = {
    "above": "above the player",
    "below": "below the player",
    "left": "to the left of the player",
    "right": "to the right of the player",
    "same row": "in the player's row",
    "same column": "in the player's column",
}
# Other words a model may use, mapped to the canonical names (lower case).
OBJECT_SYNONYMS = {
    "boxes": "box",
    "crate": "box",
    "crates": "box",
    "targets": "target",
    "holes": "hole",
    "goals": "goal",
    "keys": "key",
    "doors": "door",
    "gift": "goal",
    "present": "goal",
}
RELATION_SYNONYMS = {
    "up": "above",
    "over": "above",
    "down": "below",
    "under": "below",
    "beneath": "below",
    "to the left": "left",
    "to the right": "right",
    "same line": "same row",
    "same horizontal line": "same row",
    "same vertical line": "same column",
    "same col": "same column",
}

Fact = tuple[str, str]


def relative_facts(name: str, cells: Iterable[tuple[int, int]], player: tuple[int, int]) -> list[Fact]:
    """Vertical and horizontal relation of each cell to the player, without duplicates, in order."""
    facts: list[Fact] = []
    for row, col in cells:
        vertical = "above" if row < player[0] else "below" if row > player[0] else "same row"
        horizontal = "left" if col < player[1] else "right" if col > player[1] else "same column"
        for fact in ((name, vertical), (name, horizontal)):
            if fact not in facts:
                facts.append(fact)
    return facts


def adjacent_facts(name: str, cells: Iterable[tuple[int, int]], player: tuple[int, int]) -> list[Fact]:
    """The side of each cell that is a direct (4-)neighbour of the player."""
    sides = {(-1, 0): "above", (1, 0): "below", (0, -1): "left", (0, 1): "right"}
    facts: list[Fact] = []
    for row, col in cells:
        side = sides.get((row - player[0], col - player[1]))
        if side is not None and (name, side) not in facts:
            facts.append((name, side))
    return facts


def facts_to_sentence(facts: Iterable[Fact]) -> str:
    """E.g. [("box", "above"), ("box", "left")] -> "The box is above the player and to the left of
    the player." One sentence per object, in the order objects first appear."""
    by_object: dict[str, list[str]] = {}
    for name, relation in facts:
        by_object.setdefault(name, []).append(RELATION_PHRASES[relation])
    sentences = []
    for name, phrases in by_object.items():
        joined = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
        sentences.append(f"The {name} is {joined}.")
    return " ".join(sentences)
