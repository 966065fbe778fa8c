"""Scratch probe (round 11, not project code): are the engines' action draws independent across turns?

One rollout batch of the visual MPO recipe from its format warm start (the same policy on every map):
the repeat rate of consecutive actions against the rate that independent draws from the batch's own
action frequencies give (output: draws_vllm.txt).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python draws.py vllm .cache/sft/<the recipe's format warm start>
"""

import sys
from collections import Counter

import torch

from vagen.config import load_config
from vagen.models.loading import load_policy
from vagen.rollout.engines.base import make_engine
from vagen.rollout.manager import RolloutManager

engine_name = sys.argv[1]
torch.set_num_threads(1)
cfg = load_config("configs/frozenlake_mpo_tiny.yaml", ["rollout.seed=1", f"rollout.engine={engine_name}"])
path = sys.argv[2]
model, processor = load_policy(path)
options = {"model_path": path} if engine_name == "vllm" else {}
engine = make_engine(engine_name, model, processor, **options)
manager = RolloutManager(cfg.env, cfg.rollout, engine, processor)
for it in range(2):
    batch = manager.train_batch()
    seqs = [[a for t in ep.turns for a in t.actions] for ep in batch.episodes]
    freq = Counter(a for s in seqs for a in s)
    total = sum(freq.values())
    expected = sum((n / total) ** 2 for n in freq.values())
    pairs = [(s[i], s[i + 1]) for s in seqs for i in range(len(s) - 1)]
    repeat = sum(a == b for a, b in pairs) / max(len(pairs), 1)
    firsts = Counter(s[0] for s in seqs if s)
    print(
        engine_name,
        "batch",
        it,
        "actions",
        dict(freq),
        "repeat rate",
        round(repeat, 3),
        "independent",
        round(expected, 3),
        "first actions",
        dict(firsts),
        flush=True,
    )
