"""bench/learning.py: run planning and the table + plots written from run folders."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_learning", REPO / "bench" / "learning.py")
learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)


def fake_run(
    root: Path, name: str, algo: str, seed: int, finals: list[float], warm: Path, threads: int | None = None
) -> None:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    bench = {"task": "frozenlake", "algo": algo, "seed": seed, "warm_starts": {"format": str(warm)}}
    (run_dir / learning.BENCH_FILE).write_text(json.dumps(bench))
    lines = []
    for i, success in enumerate(finals):
        line = {"step": 10 * i, "val/success_rate": success}
        line |= {"val/success_ci_low": success - 0.05, "val/success_ci_high": success + 0.05}
        if i:
            line["time/step_s"] = 60.0  # one minute per validation interval
            line |= {"train/success_rate": success + 0.1, "train/format_ok_rate": 1.0}
            line["actor/approx_kl"] = 0.01  # no critic/explained_var: this run logged none
        elif threads is not None:  # the trainer logs its torch threads at step 0
            line["time/torch_threads"] = threads
        lines.append(line)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_summary_table_and_plots_from_run_folders(tmp_path):
    warm = tmp_path / "warm"
    warm.mkdir()
    report = {"after": {"success": 0.02, "success_ci": [0.01, 0.04]}, "teacher_success": {"optimal": 0.7}}
    (warm / learning.REPORT_FILE).write_text(json.dumps(report))
    fake_run(tmp_path / "runs", "a", "grpo", 0, [0.0, 0.2, 0.4], warm)
    fake_run(tmp_path / "runs", "b", "grpo", 1, [0.0, 0.3, 0.6], warm, threads=2)
    fake_run(tmp_path / "runs", "c", "gae", 0, [0.0, 0.1], warm)
    learning.summarize(learning.read_curves([tmp_path / "runs"]), tmp_path / "results")

    table = (tmp_path / "results" / "learning.md").read_text()
    assert "| frozenlake | grpo | 1 | 0.000 [-0.05, 0.05] | 0.600 [0.55, 0.65] @ 20 | 20 | 2.0 | 2 |" in table
    assert "| frozenlake | grpo | 0 | 0.000 [-0.05, 0.05] | 0.400 [0.35, 0.45] @ 20 | 20 | 2.0 | - |" in table
    assert "| 0.020 [0.01, 0.04] | - | 0.700 |" in table  # format warm start, no solver, the VI optimum
    assert "| frozenlake | grpo | 2 | 0.500 | 0.400 .. 0.600 |" in table  # mean over seeds
    assert (tmp_path / "results" / "learning_frozenlake.png").stat().st_size > 10_000
    assert (tmp_path / "results" / "training_frozenlake.png").stat().st_size > 10_000
    curves = {c["seed"]: c for c in json.loads((tmp_path / "results" / learning.CURVES_FILE).read_text())}
    assert curves[1]["training"] == {  # the iterations' metrics; a metric the run never logged is null
        "step": [10, 20],
        "train/success_rate": [0.4, 0.7],
        "train/format_ok_rate": [1.0, 1.0],
        "actor/approx_kl": [0.01, 0.01],
        "critic/explained_var": [None, None],
    }


def test_a_later_summary_adds_runs_to_an_earlier_ones_curves(tmp_path):
    warm = tmp_path / "warm"
    warm.mkdir()
    fake_run(tmp_path / "old", "a", "grpo", 0, [0.0, 0.2, 0.4], warm)
    fake_run(tmp_path / "old", "b", "gae", 0, [0.0, 0.1], warm)
    learning.summarize(learning.read_curves([tmp_path / "old"]), tmp_path / "results")
    curves_file = tmp_path / "results" / learning.CURVES_FILE
    fake_run(tmp_path / "new", "c", "gae", 0, [0.0, 0.3, 0.7], warm)  # gae seed 0 again: replaces the old
    fake_run(tmp_path / "new", "d", "gigpo", 0, [0.0, 0.5], warm)
    shutil.rmtree(tmp_path / "old")  # the run folders are gone; curves.json keeps their curves
    (tmp_path / "results" / "runs.md").write_text("how the runs were made\n")  # hand-kept, never rewritten
    learning.summarize(learning.read_curves([curves_file, tmp_path / "new"]), tmp_path / "results")

    table = (tmp_path / "results" / "learning.md").read_text()
    assert "| frozenlake | grpo | 0 | 0.000 [-0.05, 0.05] | 0.400 [0.35, 0.45] @ 20 | 20 | 2.0 | - |" in table
    assert "| frozenlake | gae | 0 | 0.000 [-0.05, 0.05] | 0.700 [0.65, 0.75] @ 20 | 20 | 2.0 | - |" in table
    assert "| frozenlake | gigpo | 0 |" in table and "0.100 [0.05, 0.15]" not in table
    assert {c["algo"] for c in json.loads(curves_file.read_text())} == {"grpo", "gae", "gigpo"}
    assert (tmp_path / "results" / "runs.md").read_text() == "how the runs were made\n"
    (tmp_path / "notes.json").write_text('{"task": "frozenlake"}')
    with pytest.raises(SystemExit, match="notes.json: not a curves.json"):
        learning.read_curves([tmp_path / "notes.json"])


def test_curves_json_is_strict_json_and_reads_back_a_missing_interval(tmp_path):
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / learning.REPORT_FILE).write_text(json.dumps({"after": {"success": 0.02}}))  # no interval
    fake_run(tmp_path / "runs", "a", "grpo", 0, [0.0, 0.4], warm)
    metrics = tmp_path / "runs" / "a" / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    del lines[1]["val/success_ci_low"], lines[1]["val/success_ci_high"]  # a validation with no interval
    metrics.write_text("".join(json.dumps(m) + "\n" for m in lines))
    learning.summarize(learning.read_curves([tmp_path / "runs"]), tmp_path / "results")
    curves_file = tmp_path / "results" / learning.CURVES_FILE
    strict = json.loads(curves_file.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert strict[0]["ci_low"] == [-0.05, None] and strict[0]["references"]["format"] == [0.02, None, None]
    assert strict[0]["threads"] is None
    first = (tmp_path / "results" / "learning.md").read_text()
    learning.summarize(learning.read_curves([curves_file]), tmp_path / "again")
    assert (tmp_path / "again" / "learning.md").read_text() == first
    assert "| frozenlake | grpo | 0 | 0.000 [-0.05, 0.05] | 0.400 @ 10 |" in first


def test_algorithm_names_and_modifiers():
    assert learning.algorithm_overrides("grpo") == [
        "algo.policy_loss=ppo",
        "algo.adv=grpo",
        "algo.critic=model",
    ]
    assert learning.algorithm_overrides("bilevel_gae+starpo_s")[3:] == learning.STARPO_S
    assert learning.algorithm_overrides("mpo") == ["algo.policy_loss=mpo", "algo.critic=state"]
    with pytest.raises(SystemExit, match="unknown algorithm"):
        learning.algorithm_overrides("ppo2")
    with pytest.raises(SystemExit, match="modifier"):
        learning.algorithm_overrides("grpo+dapo")


def test_solver_reference_shares_the_runs_env_levels_and_start_model():
    args = learning.parse_args(
        ["--tasks", "configs/frozenlake_mpo_tiny.yaml", "--algos", "mpo", "--seeds", "1"]
        + ["--", "perception.enabled=false", "env.env_kwargs.max_steps=12", "algo.kl_coef=0.1"]
    )
    (run,) = learning.plan_runs(args)
    command = run.solver_command()
    assert command[command.index("--teacher") + 1] == "solver"
    # the start model (perception), the env and the levels match the run's: the reference's cache folder
    # is the one warm_start_folders reads back; trainer and algorithm settings stay out
    assert command[command.index("--teacher") + 2 :] == [
        "warm_start.teacher=format",
        "warm_start.eval_levels=512",
        "perception.enabled=false",
        "env.env_kwargs.max_steps=12",
    ]


def test_default_budget_follows_the_recipes_env():
    assert learning.default_minutes("sokoban") == 60.0
    assert learning.default_minutes("configs/sokoban_mpo_tiny.yaml") == 60.0  # a path, not a task name
    assert learning.default_minutes("configs/frozenlake_slippery_mpo_tiny.yaml") == 30.0


def test_a_labelled_variant_has_its_own_name_and_folder():
    args = learning.parse_args(
        ["--tasks", "frozenlake", "--algos", "bilevel_gae", "gae", "--seeds", "0", "--label", "selective"]
        + ["--runs-root", "runs", "--", "rollout.loss_spans=[action]"]
    )
    trico, ppo = learning.plan_runs(args)
    assert trico.algo == "bilevel_gae/selective"
    assert Path(trico.run_dir).name == "frozenlake-bilevel_gae-selective-s0"
    assert ppo.algo == "gae/selective" and "algo.adv=gae" in ppo.overrides
    assert ppo.overrides[-1] == "rollout.loss_spans=[action]"
