"""Validation on 512 visual Sokoban levels: records only (`play_episodes`) vs collated rows (`collect`).

Validation needs only each episode's outcome; collating every turn's tokens and image patches into
training rows is what `collect` does for the update (`play_episodes` keeps no patches at all). Each
way runs in its own process (peak RSS is per process) from the committed Sokoban perception model
without a warm start (greedy replies are rarely in format, so every episode plays all 10 turns: the
largest validation batch), vLLM engine, one thread.
Usage: .venv/bin/python bench/validation_bench.py
(about 4 minutes; the latest output is kept in bench/results/validation_bench.txt)
"""

import os
import platform
import resource
import subprocess
import sys
import time

LEVELS = 512
OVERRIDES = [
    "model.path=assets/perception/sokoban_mpo_tiny",
    "warm_start.teacher=none",
    "perception.enabled=false",
]


def measure(mode: str) -> None:
    """Play the validation levels one way; print peak RSS (GiB), seconds and the episodes' turns."""
    import torch

    from vagen.config import load_config
    from vagen.eval import evaluation_manager

    cfg = load_config("configs/sokoban_mpo_tiny.yaml", OVERRIDES)
    torch.manual_seed(0)
    manager = evaluation_manager(cfg)
    seeds = manager.seeds.validation(LEVELS, 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    start = time.perf_counter()
    if mode == "collect":
        episodes = manager.collect(seeds, temperature=0.0).episodes
    else:
        episodes = manager.play_episodes(seeds, temperature=0.0)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    turns = sum(len(ep.turns) for ep in episodes)
    print(f"RESULT {mode} {before:.2f} {peak:.2f} {seconds:.1f} {turns}", flush=True)


def main() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    results = {}
    for mode in ("play_episodes", "collect"):
        out = subprocess.run(
            [sys.executable, __file__, mode], env=env, capture_output=True, text=True, check=True
        ).stdout
        line = next(line for line in out.splitlines() if line.startswith("RESULT"))
        _, _, before, peak, seconds, turns = line.split()
        results[mode] = (float(before), float(peak), float(seconds), int(turns))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, one thread per process")
    print(f"{LEVELS} Sokoban 6x6 validation levels, greedy, vLLM engine")
    print(f"{'mode':<14} {'RSS before GiB':>14} {'peak RSS GiB':>12} {'seconds':>8} {'turns':>6}")
    for mode, (before, peak, seconds, turns) in results.items():
        print(f"{mode:<14} {before:>14.2f} {peak:>12.2f} {seconds:>8.1f} {turns:>6}")
    play, collect = results["play_episodes"], results["collect"]
    grown_play, grown_collect = play[1] - play[0], collect[1] - collect[0]
    print(
        f"collect / play_episodes: peak RSS x{collect[1] / play[1]:.2f}, growth while playing "
        f"x{grown_collect / grown_play:.2f}, time x{collect[2] / play[2]:.2f}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        main()
