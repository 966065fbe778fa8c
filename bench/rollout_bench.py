"""Rollout engines on the tiny VLM: decode throughput and per-turn prefill cost, hf vs vllm.

    .venv/bin/python bench/rollout_bench.py [--quick] [--out bench/results/rollout_bench.txt]

1. Throughput: batch 8/32/64 prompts with 1/3/5 images of history (112-px FrozenLake-sized images,
   16 visual tokens each), 32 sampled tokens each; generated tokens per second of wall time
   (prefill included), hf / vllm ratio.
2. Prefill per turn: an 8-episode batch plays 5 turns; turn t's prompt is turn t-1's prompt + the
   reply + a new image. Time to produce 1 token per episode. With vLLM's prefix cache only the new
   turn is computed, so the cost stays flat; HF recomputes the whole history every turn.
Runs in-process on the CPU threads torch is given; numbers are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vagen.models.loading import load_policy  # noqa: E402
from vagen.rollout.engines import Prompt, SamplingParams, make_engine  # noqa: E402

REPLY = "<think>The goal is down-right of the player.</think><answer>Down, Right</answer>"


def episode_prompts(processor, batch: int, images: int, seed: int = 0) -> list[Prompt]:
    """`batch` prompts, each a chat with `images` user turns (one image each) and replies between."""
    prompts = []
    for episode in range(batch):
        rng = np.random.default_rng([seed, episode])  # per episode: turn t's images extend turn t-1's
        messages, pictures = [], []
        for turn in range(images):
            if turn:
                messages.append({"role": "assistant", "content": REPLY})
            text = f"Turn {turn + 1}. Here is the current state. Decide your next actions."
            messages.append({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]})
            pictures.append(Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)))
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(Prompt(list(processor(text=[text], images=pictures)["input_ids"][0]), pictures))
    return prompts


def timed_generate(engine, prompts: list[Prompt], params: SamplingParams) -> tuple[float, int]:
    """(seconds, generated tokens) of one generate call."""
    start = time.perf_counter()
    generations = engine.generate(prompts, params)
    return time.perf_counter() - start, sum(len(g.token_ids) for g in generations)


def throughput(
    engines: dict, processor, batches, image_counts, new_tokens: int = 32
) -> tuple[list[str], list[float]]:
    """Section 1: tokens/s per engine at each (batch, images), best of 2 after a warm-up call;
    returns the table and the vllm/hf ratios."""
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=[0], seed=0)
    lines = [
        f"{'batch':>5} {'images':>6} {'prompt tok':>10} " + "".join(f"{n + ' tok/s':>12}" for n in engines)
    ]
    lines[0] += f"{'vllm/hf':>9}"
    ratios = []
    for images in image_counts:
        for batch in batches:
            prompts = episode_prompts(processor, batch, images)
            rates = {}
            for name, engine in engines.items():
                engine.generate(prompts[:2], params)  # warm-up
                runs = [timed_generate(engine, prompts, params) for _ in range(2)]
                rates[name] = max(tokens / seconds for seconds, tokens in runs)
            row = f"{batch:>5} {images:>6} {len(prompts[0].token_ids):>10} "
            row += "".join(f"{rate:>12.0f}" for rate in rates.values())
            if "hf" in rates and "vllm" in rates:
                ratios.append(rates["vllm"] / rates["hf"])
                row += f"{ratios[-1]:>9.2f}"
            lines.append(row)
            print(lines[-1], flush=True)
    return lines, ratios


def prefill_per_turn(engines: dict, processor, batch: int = 8, turns: int = 5) -> list[str]:
    """Section 2: seconds to the first token at each turn as the history grows (1 new token per episode)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=1, seed=0)
    lines = [f"{'turn':>4} {'prompt tok':>10} " + "".join(f"{n + ' ms':>12}" for n in engines)]
    lines[0] += f"{'hf/vllm':>9}"
    for turn in range(1, turns + 1):
        prompts = episode_prompts(processor, batch, turn, seed=100)  # same seed: turn t extends turn t-1
        times = {name: timed_generate(engine, prompts, params)[0] * 1e3 for name, engine in engines.items()}
        row = f"{turn:>4} {len(prompts[0].token_ids):>10} " + "".join(f"{ms:>12.1f}" for ms in times.values())
        if "hf" in times and "vllm" in times:
            row += f"{times['hf'] / times['vllm']:>9.2f}"
        lines.append(row)
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="batch 8 only, 1 and 3 images")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (both in-process engines share them)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rollout_bench.txt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, processor = load_policy("tiny-vlm")
    engines = {"hf": make_engine("hf", model, processor)}
    start = time.perf_counter()
    engines["vllm"] = make_engine("vllm", model, processor, max_model_len=2048, max_num_seqs=64)
    vllm_startup = time.perf_counter() - start
    batches, image_counts = ([8], [1, 3]) if args.quick else ([8, 32, 64], [1, 3, 5])

    report = [
        f"rollout_bench: tiny-vlm ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, fp32), "
        f"torch threads {torch.get_num_threads()}, vllm start-up {vllm_startup:.1f} s",
        "",
        "1. Generated tokens/s (32 new tokens per prompt, prefill included; best of 2)",
    ]
    print("\n".join(report), flush=True)
    table, ratios = throughput(engines, processor, batches, image_counts)
    report += table
    report += [
        "",
        "2. Time to first token per turn, 8 episodes, history grows by one turn (prefix cache: vllm)",
    ]
    print(report[-1], flush=True)
    # A fresh engine whose cache holds nothing from section 1: the prefixes it reuses are its own.
    engines["vllm"].llm.reset_prefix_cache()
    report += prefill_per_turn(engines, processor)
    median = sorted(ratios)[len(ratios) // 2]
    report += [
        "",
        f"Faster CPU engine: {'vllm' if median > 1 else 'hf'} (vllm/hf tokens/s median {median:.2f}, "
        f"vllm faster in {sum(r > 1 for r in ratios)}/{len(ratios)} settings)",
    ]
    print(report[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
