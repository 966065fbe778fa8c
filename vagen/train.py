"""Entry point: `deepspeed vagen/train.py --config configs/X.yaml [key=value ...]`.

Also `deepspeed --num_gpus 2 vagen/train.py ...` (one process per GPU, or per CPU slot with
DS_ACCELERATOR=cpu), `torchrun --nproc_per_node 2 vagen/train.py ...`, and plain
`python vagen/train.py --config ...` (one process). Overrides are dotted keys of vagen.config.RunConfig.
A bad config or input ends the process before any work with one `config error: ...` line.
"""

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vagen.config import ConfigError, load_config_or_exit  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML run config (configs/*.yaml)")
    parser.add_argument("--local_rank", type=int, default=None, help="set by the deepspeed launcher")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.adv=grpo trainer.steps=50")
    args = parser.parse_args(argv)
    cfg = load_config_or_exit(args.config, args.overrides)
    from vagen.trainer import train  # loads torch, DeepSpeed and transformers: after the config is read

    try:
        train(cfg)
    except ConfigError as err:  # a start-up check (vagen.startup.check_run): nothing was written
        sys.exit(f"config error: {err}")


if __name__ == "__main__":
    main()
