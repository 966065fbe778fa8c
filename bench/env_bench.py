"""Sokoban generation, rendering and stepping speed, against gym-sokoban 0.0.6 when it is installed.

Prints, for 6x6/1, 8x8/2 and 10x10/4 rooms: levels/s and the distribution of optimal solution
lengths (ours from the generator, gym-sokoban's from our solver), then frames/s and steps/s.
gym-sokoban needs old gym, so it runs in its own interpreter: set GYM_SOKOBAN_PYTHON (default
/tmp/gymsok-venv/bin/python, made with `python3 -m venv /tmp/gymsok-venv &&
/tmp/gymsok-venv/bin/pip install gym-sokoban==0.0.6`); without it only our figures are printed.
Usage: python bench/env_bench.py   (about 1-2 minutes; output kept in bench/results/env_bench.txt)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import gymnasium
import numpy as np

import envs_visual  # noqa: F401  (registers the envs)
from envs_visual.sokoban import SolverLimitError, generate_level, solve

# (rows, cols, boxes, seconds for ours, seconds and level cap for gym-sokoban)
CASES = [(6, 6, 1, 5.0, 8.0, 4000), (8, 8, 2, 5.0, 12.0, 400), (10, 10, 4, 5.0, 25.0, 6)]
# gym-sokoban's 10x10/4 levels are longer than our default's, so that case also runs with a floor.
HARDER = {(10, 10, 4): 30}
GYM_SOKOBAN_PYTHON = Path(os.environ.get("GYM_SOKOBAN_PYTHON", "/tmp/gymsok-venv/bin/python"))
PROBE = Path(__file__).resolve().parent / "gym_sokoban_probe.py"
SOLVER_CAP = 300_000  # states per gym-sokoban level when measuring its optimal lengths
BUCKETS = [(1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 10_000)]


def length_summary(lengths: list[int]) -> str:
    if not lengths:
        return "no levels"
    values = np.array(lengths)
    shares = " ".join(f"{np.mean((values >= lo) & (values <= hi)):4.0%}" for lo, hi in BUCKETS)
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    spread = f"p10/p50/p90 {p10:3.0f}/{p50:3.0f}/{p90:3.0f}"
    return f"mean {values.mean():5.1f}  {spread}  max {values.max():3d}  [{shares}]"


def time_ours(
    rows: int, cols: int, boxes: int, seconds: float, min_steps: int = 1
) -> tuple[float, list[int]]:
    lengths, seed, start = [], 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, optimal_steps = generate_level(
            np.random.default_rng(seed), (rows, cols), boxes, min_steps=min_steps
        )
        lengths.append(optimal_steps)
        seed += 1
    return len(lengths) / (time.perf_counter() - start), lengths


def run_gym_sokoban() -> dict | None:
    if not GYM_SOKOBAN_PYTHON.exists():
        print(f"gym-sokoban: not measured ({GYM_SOKOBAN_PYTHON} missing; see the docstring to install it)")
        return None
    request = {"cases": [[r, c, b, s, n] for r, c, b, _, s, n in CASES], "render_frames": 300}
    result = subprocess.run(
        [str(GYM_SOKOBAN_PYTHON), str(PROBE), json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        print(f"gym-sokoban: probe failed:\n{result.stderr[-2000:]}")
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def optimal_lengths(levels: list[str]) -> tuple[list[int], int]:
    lengths, unknown = [], 0
    for level in levels:
        try:
            solution = solve(level, max_states=SOLVER_CAP)
        except SolverLimitError:
            solution = None
        if solution is None:
            unknown += 1
        else:
            lengths.append(len(solution))
    return lengths, unknown


def time_env(steps: int = 20_000) -> tuple[float, float, float]:
    env = gymnasium.make("envs_visual/Sokoban-v0", max_steps=10**9).unwrapped
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        env.renderer.render(env._static_codes)
    tiles_per_s = steps / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(steps):
        env.render()
    frames_per_s = steps / (time.perf_counter() - start)
    actions = np.random.default_rng(0).integers(0, 4, steps)
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, _, _ = env.step(int(action))
        if terminated:
            env.reset()
    return tiles_per_s, frames_per_s, steps / (time.perf_counter() - start)


def main():
    print(
        f"# env_bench  {time.strftime('%Y-%m-%d')}  {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cpus (load {os.getloadavg()[0]:.1f}), python {platform.python_version()}, "
        f"numpy {np.__version__}"
    )
    print("# lengths: optimal solution length in moves; shares in buckets 1-2|3-4|5-8|9-16|17-32|33-64|65+")
    gym = run_gym_sokoban()
    for index, (rows, cols, boxes, seconds, _, _) in enumerate(CASES):
        print(f"\n{rows}x{cols}, {boxes} box(es)")
        rates = []
        for min_steps in [1] + ([HARDER[rows, cols, boxes]] if (rows, cols, boxes) in HARDER else []):
            rate, lengths = time_ours(rows, cols, boxes, seconds, min_steps)
            label = "ours" if min_steps == 1 else f"ours >= {min_steps}"
            print(f"  {label:12s} {rate:9.1f} levels/s  ({len(lengths)} levels)   {length_summary(lengths)}")
            rates.append(rate)
        if gym is not None:
            case = gym["cases"][index]
            theirs, unknown = optimal_lengths(case["levels"])
            note = f"  ({unknown} not solved within {SOLVER_CAP} states)" if unknown else ""
            print(
                f"  gym-sokoban  {case['levels_per_s']:9.2f} levels/s  ({len(case['levels'])} levels)   "
                f"{length_summary(theirs)}{note}"
            )
            print("  ratio        " + ", ".join(f"{ours / case['levels_per_s']:.1f}x" for ours in rates))
    tiles_per_s, frames_per_s, steps_per_s = time_env()
    print("\n6x6 rendering and stepping (28 px cells, 168x168 images)")
    print(
        f"  ours  tile gather {tiles_per_s:9.0f} frames/s;  env.render() {frames_per_s:9.0f} frames/s;  "
        f"env.step() with image+XSB observation {steps_per_s:9.0f} steps/s"
    )
    if gym is not None:
        print(
            f"  gym-sokoban room_to_rgb {gym['frames_per_s']:9.0f} frames/s;  ratio (env.render) "
            f"{frames_per_s / gym['frames_per_s']:.0f}x"
        )


if __name__ == "__main__":
    main()
