"""`python -m vagen.eval`: a base model and a saved checkpoint, success with CI, GIFs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vagen.eval import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    return one_torch_thread


def test_eval_base_model_and_checkpoint_agree_on_the_same_weights(tmp_path):
    config = "configs/frozenlake_tiny.yaml"
    tiny = [
        "warm_start.teacher=none",
        "rollout.engine=hf",
        "rollout.max_turns=2",
        "rollout.max_new_tokens=12",
    ]
    base = main(
        ["--config", config, "--episodes", "4", "--gifs", "2", "--out", str(tmp_path / "base"), *tiny]
    )
    assert base["num_episodes"] == 4
    assert 0.0 <= base["success_ci_low"] <= base["success_rate"] <= base["success_ci_high"] <= 1.0
    assert len(list((tmp_path / "base" / "step_000000").glob("*.gif"))) == 2
    assert json.loads((tmp_path / "base" / "summary.json").read_text()) == base
    assert sum(base["end_reasons"].values()) == pytest.approx(1.0)  # every episode ended one way
    assert set(base["end_reasons"]) <= {"success", "failure", "truncated", "max_turns", "action_budget"}

    # a checkpoint folder holding the untouched base weights gives the same greedy episodes
    from vagen.models.loading import load_policy

    model, processor = load_policy("tiny-vlm")
    model.save_pretrained(tmp_path / "ckpt" / "actor")
    processor.save_pretrained(tmp_path / "ckpt" / "actor")
    saved = main(
        ["--config", config, "--checkpoint", str(tmp_path / "ckpt"), "--episodes", "4", "--gifs", "0", *tiny]
    )
    assert (tmp_path / "ckpt" / "eval" / "summary.json").is_file()
    assert {k: v for k, v in saved.items() if k != "checkpoint"} == {
        k: v for k, v in base.items() if k != "checkpoint"
    }


def test_eval_cli_errors_are_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "vagen.eval", "--config", "configs/frozenlake_tiny.yaml", "algo.adv=nope"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert (
        done.stderr.strip().splitlines()[-1].startswith("config error: bad value for config key 'algo.adv'")
    )
    with pytest.raises(FileNotFoundError, match="has no actor/ folder"):
        main(
            [
                "--config",
                "configs/frozenlake_tiny.yaml",
                "--checkpoint",
                str(REPO / "configs"),
                "--episodes",
                "2",
                "warm_start.teacher=none",
            ]
        )
