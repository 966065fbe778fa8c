"""Times gym-sokoban 0.0.6's generator and renderer; run by env_bench.py with gym-sokoban's own Python.

Prints one JSON object: per case, levels/s and the generated levels as XSB; frames/s of room_to_rgb.
Usage: python gym_sokoban_probe.py '{"cases": [[6, 6, 1, 20.0, 200]], "render_frames": 200}'
(each case: rows, cols, boxes, time budget in s, max levels).
"""

import json
import random
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
from gym_sokoban.envs.render_utils import room_to_rgb  # noqa: E402
from gym_sokoban.envs.room_utils import generate_room  # noqa: E402

XSB_OF_STATE = {0: "#", 1: " ", 2: ".", 3: "*", 4: "$", 5: "@"}


def to_xsb(structure, state):
    rows = []
    for r in range(state.shape[0]):
        row = ""
        for c in range(state.shape[1]):
            char = XSB_OF_STATE[int(state[r, c])]
            on_target = structure[r, c] == 2
            if char == "$" and on_target:
                char = "*"
            elif char == "@" and on_target:
                char = "+"
            row += char
        rows.append(row)
    return "\n".join(rows)


def main():
    request = json.loads(sys.argv[1])
    random.seed(0)
    np.random.seed(0)
    result = {"cases": []}
    for rows, cols, boxes, budget_s, max_levels in request["cases"]:
        levels, start = [], time.perf_counter()
        while time.perf_counter() - start < budget_s and len(levels) < max_levels:
            try:
                structure, state, _ = generate_room(
                    dim=(rows, cols), num_steps=int(1.7 * (rows + cols)), num_boxes=boxes
                )
            except (RuntimeError, RuntimeWarning):
                continue  # the env's reset retries too; the time still counts
            levels.append(to_xsb(structure, state))
        elapsed = time.perf_counter() - start
        result["cases"].append(
            {"dim": [rows, cols], "boxes": boxes, "levels_per_s": len(levels) / elapsed, "levels": levels}
        )
    structure, state, _ = generate_room(dim=(6, 6), num_steps=20, num_boxes=1)
    start = time.perf_counter()
    for _ in range(request["render_frames"]):
        room_to_rgb(state, structure)
    result["frames_per_s"] = request["render_frames"] / (time.perf_counter() - start)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
