"""Where a training iteration's wall time goes, and how much padding the update computes.

Runs the `make train` recipe (configs/frozenlake_tiny.yaml, CPU) for a few iterations and prints the
per-iteration split (rollout / scoring / update / logging), update tokens per second, and the share
of padded token slots in the update's micro-batches: rows bucketed by length (what the trainer does)
against rows in random order (the alternative).

    .venv/bin/python bench/step_bench.py [--steps 6] [--threads 2] [key=value ...]
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vagen.batching import derived_sizes, micro_batches  # noqa: E402
from vagen.config import load_config  # noqa: E402
from vagen.distributed import init_distributed  # noqa: E402
from vagen.metrics import read_metrics  # noqa: E402
from vagen.models.build import build_models  # noqa: E402
from vagen.trainer import train  # noqa: E402
from vagen.updates import POLICY_UPDATES  # noqa: E402


def pad_share(lengths: torch.Tensor, plans: list[list[torch.Tensor]]) -> float:
    """Padded slots / all slots when each micro-batch is cut to its longest row."""
    slots = sum(len(rows) * int(lengths[rows].max()) for plan in plans for rows in plan if len(rows))
    return 1.0 - float(lengths.sum()) / slots


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6, help="iterations (the first is not counted)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = REPO / "configs" / "frozenlake_tiny.yaml"
    with tempfile.TemporaryDirectory() as run_dir:
        overrides = [f"trainer.run_dir={run_dir}", f"trainer.steps={args.steps}", "trainer.save_every=0",
                     "trainer.viz_every=0", "trainer.val_groups=4", *args.overrides]  # fmt: skip
        cfg = load_config(config, overrides)
        train(cfg)
        steps = [m for m in read_metrics(Path(run_dir) / "metrics.jsonl") if "time/step_s" in m][
            1:
        ]  # skip warm-up

        # padding of the same rollout's rows, bucketed by length vs in random order
        from vagen.rollout.manager import RolloutManager

        _, world = init_distributed()
        sizes = derived_sizes(cfg, world)
        models = build_models(cfg, sizes, POLICY_UPDATES[cfg.algo.policy_loss])
        manager = RolloutManager(cfg.env, cfg.rollout, models.generation, models.processor)
        batch = manager.collect(manager.seeds.next_train(cfg.rollout.num_groups, cfg.rollout.group_size))
    lengths = batch.attention_mask.sum(dim=1)
    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(0))
    minis = order.tensor_split(cfg.algo.mini_batches)
    size, count = cfg.trainer.micro_batch_size, sizes.micro_batches_per_step
    bucketed = pad_share(lengths, [micro_batches(mini, lengths, size, count) for mini in minis])
    unsorted = pad_share(lengths, [list(mini.split(size)) for mini in minis])
    # a trained policy ends episodes after 1..max_turns turns: rows of a few distinct lengths
    turn_tokens = int(lengths.max()) // cfg.rollout.max_turns
    mixed = turn_tokens * torch.randint(
        1, cfg.rollout.max_turns + 1, (len(batch),), generator=torch.Generator().manual_seed(1)
    )
    mixed_bucketed = pad_share(mixed, [micro_batches(mini, mixed, size, count) for mini in minis])
    mixed_unsorted = pad_share(mixed, [list(mini.split(size)) for mini in minis])

    # the fastest iteration stands for the machine, the median for a typical one on a shared machine
    fastest = min(steps, key=lambda m: m["time/step_s"])

    def median(key: str) -> float:
        return statistics.median(m.get(key, 0.0) for m in steps)

    step_s = median("time/step_s")
    r = cfg.rollout
    print(f"frozenlake_tiny.yaml: {len(steps)} iterations after warm-up, {torch.get_num_threads()} threads")
    print(
        f"  {r.num_groups} groups x {r.group_size} episodes, <= {r.max_turns} turns x {r.max_new_tokens} tok"
    )
    print(f"  {sizes.describe()}")
    print(f"{'phase':<10}{'fastest s':>10}{'share':>8}{'median s':>10}")
    for phase in ("rollout", "score", "update", "log"):
        seconds = fastest.get(f"time/{phase}_s", 0.0)
        share = seconds / fastest["time/step_s"]
        print(f"{phase:<10}{seconds:>10.2f}{share:>8.1%}{median(f'time/{phase}_s'):>10.2f}")
    print(f"{'step':<10}{fastest['time/step_s']:>10.2f}{'':>8}{step_s:>10.2f}")
    print(
        f"update: {fastest['time/update_tokens_per_s']:.0f} tokens/s in the fastest iteration "
        f"(median {median('time/update_tokens_per_s'):.0f}; real tokens, each through actor + critic)"
    )
    print(
        f"padded token slots in update micro-batches (trainer, measured): {median('actor/pad_fraction'):.1%}"
    )
    print("padded token slots, rows bucketed by length (trainer) vs random order:")
    print(
        f"  this rollout (rows {int(lengths.min())}..{int(lengths.max())} tok): "
        f"{bucketed:.1%} vs {unsorted:.1%} ({unsorted / max(bucketed, 1e-9):.1f}x)"
    )
    print(
        f"  simulated episodes of 1..{cfg.rollout.max_turns} turns "
        f"(rows {int(mixed.min())}..{int(mixed.max())} tok): "
        f"{mixed_bucketed:.1%} vs {mixed_unsorted:.1%} ({mixed_unsorted / max(mixed_bucketed, 1e-9):.1f}x)"
    )


if __name__ == "__main__":
    main()
