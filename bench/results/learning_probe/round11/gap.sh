#!/bin/bash
# rollout/logprob_gap of the visual MPO recipe (seed 1) with each engine, 4 iterations
for engine in vllm hf; do
  OMP_NUM_THREADS=1 .venv/bin/python vagen/train.py --config configs/frozenlake_mpo_tiny.yaml trainer.seed=1 rollout.seed=1 \
    trainer.steps=4 trainer.val_groups=8 trainer.save_every=0 trainer.viz_every=0 rollout.engine=$engine \
    trainer.run_dir=runs/r15/gap_$engine > runs/r15/gap_$engine.log 2>&1
done
