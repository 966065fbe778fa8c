"""Env steps/s in process against through the env service (envs_visual.service on localhost), and the
service's overhead per step in ms; the resets of a rollout, and the steps of a turn, one request each
against one batched request (reset_all, step_all).

For FrozenLake 4x4 (112x112 images, the tiny recipes) and Sokoban 6x6 (168x168): random actions,
resetting on episode end. The server runs in its own process on this machine, so the figures are the
price of HTTP + JSON + PNG on one host (a network adds its round trip).
Usage: python bench/env_service_bench.py   (about a minute; output also written to
bench/results/env_service_bench.txt)
"""

import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium
import httpx
import numpy as np

import envs_visual  # noqa: F401  (registers the envs)
from envs_visual.remote import ServiceClient, reset_all, step_all

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "bench" / "results" / "env_service_bench.txt"
CASES = [
    ("FrozenLake 4x4", "envs_visual/FrozenLake-v0", {"size": 4, "max_steps": 10}),
    ("Sokoban 6x6", "envs_visual/Sokoban-v0", {}),
]
STEPS = 2000
RESET_ENVS = 64  # G x n of the tiny recipes (8 x 8)
TURNS = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "envs_visual.service", "--port", str(port)]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("the env server did not start")


def steps_per_s(env: gymnasium.Env, steps: int) -> float:
    actions = np.random.default_rng(0).integers(0, 4, steps)
    env.reset(seed=0)
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def reset_seconds(envs: list[gymnasium.Env], batched: bool) -> float:
    seeds, options = list(range(len(envs))), [{"dynamics_seed": seed} for seed in range(len(envs))]
    start = time.perf_counter()
    if batched:
        reset_all(envs, seeds, options)
    for env, seed, option in zip(envs, seeds, options, strict=True):
        env.reset(seed=seed, options=option)
    return time.perf_counter() - start


def turn_seconds(envs: list[gymnasium.Env], batched: bool) -> float:
    """Seconds per turn of one random action in every env (an env that ends is reset)."""
    rng = np.random.default_rng(0)
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(TURNS):
        actions = [int(action) for action in rng.integers(0, 4, len(envs))]
        if batched:
            step_all(envs, [[action] for action in actions])
        for env, action in zip(envs, actions, strict=True):
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
    return (time.perf_counter() - start) / TURNS


def main() -> None:
    lines = [
        f"# env_service_bench  {time.strftime('%Y-%m-%d')}  {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cpus (load {os.getloadavg()[0]:.1f}), python {platform.python_version()}; "
        f"server on localhost, {STEPS} random steps per figure"
    ]
    print(lines[0], flush=True)
    port = free_port()
    server = start_server(port)
    try:
        client = ServiceClient(f"http://127.0.0.1:{port}")
        for name, env_id, kwargs in CASES:
            local = steps_per_s(gymnasium.make(env_id, **kwargs), STEPS)
            remote = steps_per_s(client.make(env_id, kwargs), STEPS)
            overhead_ms = 1e3 * (1 / remote - 1 / local)
            envs = [client.make(env_id, kwargs) for _ in range(RESET_ENVS)]
            one_by_one, batched = reset_seconds(envs, batched=False), reset_seconds(envs, batched=True)
            turn_each, turn_batched = turn_seconds(envs, batched=False), turn_seconds(envs, batched=True)
            for env in envs:
                env.close()
            found = [
                f"\n{name}",
                f"  in process     {local:9.0f} steps/s",
                f"  env service    {remote:9.0f} steps/s   ratio {local / remote:5.1f}x slower, "
                f"overhead {overhead_ms:.2f} ms per step",
                f"  {RESET_ENVS} resets  one request each {1e3 * one_by_one:7.1f} ms, one batched request "
                f"{1e3 * batched:7.1f} ms   ratio {one_by_one / batched:4.1f}x",
                f"  {RESET_ENVS} steps  one request each {1e3 * turn_each:7.1f} ms, one batched request "
                f"{1e3 * turn_batched:7.1f} ms   ratio {turn_each / turn_batched:4.1f}x  (a turn)",
            ]
            print("\n".join(found), flush=True)
            lines += found
    finally:
        server.kill()
        server.wait()
    RESULT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
