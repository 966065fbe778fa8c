"""The learning benchmark: does RL make the tiny VLM better, by which algorithm, how fast?

For every task x algorithm x seed it runs `vagen/train.py` from the task's recipe (format warm start,
the same seeds and budgets for every algorithm) as a subprocess, validates every `--val-every` steps on
`--val-levels` held-out levels (success with a 95% Wilson CI), and stops the run politely (SIGINT, then
SIGTERM after a grace period) once `--minutes` of RL have passed -- the clock starts when the run logs
its step-0 validation, so model loading and the cached warm start do not count. Before the runs of a
task it builds the solver warm start (`python -m vagen.pretrain.sft --teacher solver`, cached), the
imitation reference. Run folders go to --runs-root (runs/bench_learning, outside the tree); then it
writes under bench/results/:

- learning.md: task, algorithm, seed, success before and after RL (95% CI), steps, wall minutes, the
  format- and solver-warm-start success and, where the env has one, the value-iteration optimum (all
  three read from the warm starts' reports, measured on the same number of validation levels);
- learning_<task>.png: success vs wall minutes and vs steps, one line per algorithm/seed;
- training_<task>.png: per iteration, training success, well-formed replies, approximate KL and the
  critic's explained variance, for the runs that logged them (why a run does or does not learn);
- curves.json: every curve of the summary, so that a later summary can add runs to it after the run
  folders are gone.
A hand-kept runs.md beside them (the commands, commits and notes of the runs) is never rewritten.

    .venv/bin/python bench/learning.py --dry-run                      # print the commands only
    .venv/bin/python bench/learning.py --tasks sokoban --algos gae grpo bilevel_gae gigpo --seeds 0
    .venv/bin/python bench/learning.py --summarize-only runs/bench_learning   # table + plots again
    .venv/bin/python bench/learning.py --summarize-only bench/results/curves.json runs/new   # add runs

Tasks are recipe names (configs/<task>_tiny.yaml) or YAML paths; algorithms are advantage estimators
with an optional "+starpo_s" (StarPO-S: keep the groups with the largest in-group return std).
`--label selective` names a variant (one algorithm with extra overrides): `bilevel_gae/selective`.
"""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vagen.algo import ADVANTAGE_ESTIMATORS  # noqa: E402
from vagen.metrics import read_metrics  # noqa: E402
from vagen.pretrain.supervised import REPORT_FILE  # noqa: E402
from vagen.updates import POLICY_UPDATES  # noqa: E402

TASK_RECIPES = {
    "frozenlake": "configs/frozenlake_tiny.yaml",
    "sokoban": "configs/sokoban_tiny.yaml",
    "frozenlake_slippery": "configs/frozenlake_slippery_tiny.yaml",
}
# minutes of RL per run asked by the issue, by the recipe's env (Sokoban gets twice the FrozenLake budget)
ENV_MINUTES = {"envs_visual/Sokoban-v0": 60.0, "envs_visual/FrozenLake-v0": 30.0}
ALGORITHMS = ("gae", "grpo", "bilevel_gae", "bilevel_gae+starpo_s", "gigpo", "mpo")
STARPO_S = ["algo.filter.rule=top_std_fraction", "algo.filter.keep=0.5"]  # keep 4 of the recipes' 8 groups
REFERENCE_WARM_STARTS = ("format", "solver")  # warm_start.teacher names
BENCH_FILE = "bench.json"
CURVES_FILE = "curves.json"  # every curve of a summary, so a later summary can add runs to it
# per-iteration metrics of training_<task>.png: metrics.jsonl key -> panel title
TRAINING_METRICS = {
    "train/success_rate": "training success (sampled)",
    "train/format_ok_rate": "well-formed replies",
    "actor/approx_kl": "approximate KL(old || new) per token",
    "critic/explained_var": "critic explained variance",
}
GRACE_SECONDS = 120.0
POLL_SECONDS = 5.0


# ----------------------------------------------------------------------------------------------
# planning the runs


def algorithm_overrides(algo: str) -> list[str]:
    """`gae`, `grpo`, ... (advantage estimators) -> PPO's update with algo.adv=... (critic-based ones with a
    value head on the policy's backbone); another policy update's name (`mpo`) -> that update with its
    privileged state critic; a "+starpo_s" suffix adds the StarPO-S group filter."""
    base, _, extra = algo.partition("+")
    if base in ADVANTAGE_ESTIMATORS:
        update = ["algo.policy_loss=ppo", f"algo.adv={base}", "algo.critic=model"]
    elif base in POLICY_UPDATES:
        update = [f"algo.policy_loss={base}", "algo.critic=state"]
    else:
        known = sorted({*ADVANTAGE_ESTIMATORS, *POLICY_UPDATES} - {"ppo"})
        raise SystemExit(f"unknown algorithm '{base}' in '{algo}': not one of {known}")
    if extra not in ("", "starpo_s"):
        raise SystemExit(f"unknown algorithm modifier '+{extra}' in '{algo}' (only +starpo_s)")
    return update + (STARPO_S if extra else [])


def recipe_of(task: str) -> Path:
    path = REPO / TASK_RECIPES.get(task, task)
    if not path.is_file():
        raise SystemExit(f"unknown task '{task}': not one of {sorted(TASK_RECIPES)} nor a YAML file")
    return path


def task_name(task: str) -> str:
    return task if task in TASK_RECIPES else Path(task).stem


def default_minutes(task: str) -> float:
    """The issue's RL budget for the task's env: 60 minutes for Sokoban recipes, 30 otherwise."""
    env_id = yaml.safe_load(recipe_of(task).read_text()).get("env", {}).get("env_id")
    return ENV_MINUTES.get(env_id, 30.0)


@dataclass
class Run:
    """One training subprocess and what the summary needs to know about it."""

    task: str
    algo: str
    seed: int
    recipe: str
    run_dir: str
    overrides: list[str]
    minutes: float | None
    warm_starts: dict[str, str] = field(default_factory=dict)  # "format" / "solver" -> model folder

    def train_command(self) -> list[str]:
        return [sys.executable, "vagen/train.py", "--config", self.recipe, *self.overrides]

    def solver_command(self) -> list[str]:
        """The solver warm start, on the run's env, levels and start model (perception too)."""
        prefixes = ("rollout.", "env.", "warm_start.", "model.", "perception.")
        shared = [o for o in self.overrides if o.startswith(prefixes)]
        command = ["-m", "vagen.pretrain.sft", "--config", self.recipe, "--teacher", "solver", *shared]
        return [sys.executable, *command]


def plan_runs(args: argparse.Namespace) -> list[Run]:
    runs = []
    for task in args.tasks:
        name = task_name(task)
        minutes = args.minutes if args.minutes is not None else default_minutes(task)
        for seed in args.seeds:
            for algo in args.algos:
                variant = f"{algo}/{args.label}" if args.label else algo
                folder = f"{name}-{variant}-s{seed}".replace("+", "-").replace("/", "-")
                run_dir = Path(args.runs_root) / folder
                overrides = [
                    *algorithm_overrides(algo),
                    "warm_start.teacher=format",  # every algorithm starts from the format warm start
                    f"trainer.seed={seed}",
                    f"trainer.steps={args.steps}",
                    f"trainer.val_every={args.val_every}",
                    f"trainer.val_groups={args.val_levels}",
                    f"warm_start.eval_levels={args.val_levels}",  # warm-start references on as many levels
                    "trainer.save_every=0",
                    "trainer.viz_every=0",
                    f"trainer.run_dir={run_dir}",
                    *args.overrides,
                ]
                runs.append(
                    Run(
                        name,
                        variant,
                        seed,
                        os.path.relpath(recipe_of(task), REPO),
                        str(run_dir),
                        overrides,
                        minutes,
                    )
                )
    return runs


def warm_start_folders(run: Run) -> dict[str, str]:
    """Where the run's format and solver warm starts are cached (a hash of their inputs), on the run's
    start model (its perception-pretrained copy, built by then, when perception is on)."""
    from vagen.config import load_config
    from vagen.pretrain import start_model
    from vagen.pretrain.sft import warm_start_dir

    cfg = load_config(REPO / run.recipe, run.overrides)
    base = start_model(cfg, log=lambda _: None)
    return {
        kind: str(warm_start_dir(base, cfg.env, cfg.rollout, replace(cfg.warm_start, teacher=kind)))
        for kind in REFERENCE_WARM_STARTS
    }


# ----------------------------------------------------------------------------------------------
# running them


def step0_logged(metrics_file: Path) -> bool:
    return any(m.get("step") == 0 for m in read_metrics(metrics_file))


def stop_politely(process: subprocess.Popen) -> None:
    """SIGINT to the run's process group, SIGTERM after a grace period, SIGKILL as the last resort."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            continue


def run_training(run: Run) -> str:
    """Run one training subprocess (log in <run_dir>/bench.log); 'finished', 'budget' or 'failed rc=N'."""
    run_dir = REPO / run.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / BENCH_FILE).write_text(json.dumps(asdict(run), indent=2))
    metrics_file = run_dir / "metrics.jsonl"
    with (run_dir / "bench.log").open("w") as log:
        process = subprocess.Popen(
            run.train_command(),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # a background shell starts us with SIGINT ignored, which the run would inherit: the polite
            # stop would then wait out the whole grace period
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        rl_started = None
        while process.poll() is None:
            time.sleep(POLL_SECONDS)
            if rl_started is None and step0_logged(metrics_file):
                rl_started = time.monotonic()
            if (
                run.minutes is not None
                and rl_started is not None
                and time.monotonic() - rl_started > run.minutes * 60
            ):
                stop_politely(process)
                return "budget"
    return "finished" if process.returncode == 0 else f"failed rc={process.returncode}"


def execute(runs: list[Run], with_solver: bool, dry_run: bool) -> None:
    solver_done: set[str] = set()  # one solver warm start per task: its levels follow warm_start.seed
    for run in runs:
        if with_solver and run.task not in solver_done:
            solver_done.add(run.task)
            print("$ " + shlex.join(run.solver_command()), flush=True)
            if not dry_run:
                log_file = REPO / Path(run.run_dir).parent / f"warm-start-solver-{run.task}.log"
                log_file.parent.mkdir(parents=True, exist_ok=True)
                with log_file.open("w") as log:
                    solver = subprocess.run(
                        run.solver_command(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
                    )
                if solver.returncode:  # the runs go on, without the imitation reference
                    print(f"  solver warm start failed (rc={solver.returncode}), see {log_file}", flush=True)
        budget = f"  # stopped after {run.minutes:g} min of RL" if run.minutes is not None else ""
        print("$ " + shlex.join(run.train_command()) + budget, flush=True)
        if dry_run:
            continue
        run.warm_starts = warm_start_folders(run)
        started = time.monotonic()
        outcome = run_training(run)
        minutes = (time.monotonic() - started) / 60
        print(f"  {run.task} {run.algo} seed {run.seed}: {outcome} after {minutes:.1f} min", flush=True)


# ----------------------------------------------------------------------------------------------
# reading and summarising run folders


# a success rate and its 95% interval (None where none was logged)
RateWithCI = tuple[float, float | None, float | None]


@dataclass
class Curve:
    """The validations of one run, and its references."""

    task: str
    algo: str
    seed: int
    steps: list[int]  # step of each validation (0 = before RL)
    minutes: list[float]  # RL wall minutes at each validation (sum of time/step_s)
    success: list[float]
    ci_low: list[float | None]  # None: the validation logged no interval (JSON null in curves.json)
    ci_high: list[float | None]
    last_step: int
    references: dict[str, RateWithCI | float]  # format/solver: (rate, low, high); optimal: rate
    minutes_total: float = 0.0  # RL wall minutes of the whole run
    threads: int | None = None  # torch threads per rank (logged at step 0 since 2026-12-04)
    # "step" and each TRAINING_METRICS key -> one value per training iteration (None: not logged then);
    # empty for curves summarized before 2026-12-07
    training: dict[str, list[float | None]] = field(default_factory=dict)


def read_references(warm_starts: dict[str, str]) -> dict:
    references: dict = {}
    for kind, folder in warm_starts.items():
        report_file = Path(folder) / REPORT_FILE
        if not report_file.is_file():
            continue
        report = json.loads(report_file.read_text())
        after = report.get("after") or {}
        if "success" in after:
            references[kind] = (after["success"], *after.get("success_ci", [None, None]))
        optimal = (report.get("teacher_success") or {}).get("optimal")
        if optimal is not None:
            references["optimal"] = optimal
    return references


def describe_run(run_dir: Path) -> tuple[str, str, int, dict[str, str]]:
    """task, algorithm, seed and warm-start folders: from bench.json, else from the saved config.yaml."""
    if (run_dir / BENCH_FILE).is_file():
        bench = json.loads((run_dir / BENCH_FILE).read_text())
        return bench["task"], bench["algo"], bench["seed"], bench.get("warm_starts", {})
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    algo_cfg = cfg.get("algo", {})
    algo = algo_cfg.get("adv", "?") + (
        "+starpo_s" if algo_cfg.get("filter", {}).get("keep", 1.0) < 1.0 else ""
    )
    return run_dir.name, algo, int(cfg.get("trainer", {}).get("seed", 0)), {}


def read_curve(run_dir: Path) -> Curve | None:
    metrics = read_metrics(run_dir / "metrics.jsonl")
    if not metrics:
        return None
    task, algo, seed, warm_starts = describe_run(run_dir)
    curve = Curve(task, algo, seed, [], [], [], [], [], 0, read_references(warm_starts))
    elapsed = 0.0
    for line in sorted(metrics, key=lambda m: m["step"]):
        if any(key in line for key in TRAINING_METRICS):
            for key in ("step", *TRAINING_METRICS):
                curve.training.setdefault(key, []).append(line.get(key))
        elapsed += line.get("time/step_s", 0.0)
        curve.last_step = max(curve.last_step, int(line["step"]))
        curve.threads = line.get("time/torch_threads", curve.threads)
        if "val/success_rate" in line:
            curve.steps.append(int(line["step"]))
            curve.minutes.append(elapsed / 60)
            curve.success.append(line["val/success_rate"])
            curve.ci_low.append(line.get("val/success_ci_low"))
            curve.ci_high.append(line.get("val/success_ci_high"))
    curve.minutes_total = elapsed / 60
    return curve


def read_curves(sources: list[Path]) -> list[Curve]:
    """Curves from run folders (at or below each folder) and from earlier summaries' curves.json; a
    later source replaces an earlier curve of the same task, algorithm and seed."""
    curves: dict[tuple[str, str, int], Curve] = {}
    for source in sources:
        if source.is_file():
            try:
                found = [Curve(**fields) for fields in json.loads(source.read_text())]
            except (ValueError, TypeError) as err:  # not JSON, or not a list of Curve fields
                raise SystemExit(f"{source}: not a {CURVES_FILE} of bench/learning.py ({err})") from None
        else:
            found = [c for c in map(read_curve, find_run_dirs(source)) if c is not None]
        curves |= {(c.task, c.algo, c.seed): c for c in found}
    return list(curves.values())


def find_run_dirs(folder: Path) -> list[Path]:
    """Every folder holding a metrics.jsonl, at or below `folder`."""
    return sorted({p.parent for p in folder.rglob("metrics.jsonl")})


def rate(value: float, low: float | None = None, high: float | None = None) -> str:
    if low is None:
        return f"{value:.3f}"
    return f"{value:.3f} [{low:.2f}, {high:.2f}]"


def reference_rate(value: RateWithCI | list | float) -> RateWithCI:
    """A reference as (rate, low, high): the optimum is a bare rate, and curves.json reads tuples as lists."""
    return tuple(value) if isinstance(value, tuple | list) else (value, None, None)


def reference_cell(references: dict, kind: str) -> str:
    value = references.get(kind)
    return "-" if value is None else rate(*reference_rate(value))


def markdown_table(curves: list[Curve]) -> str:
    header = (
        "| task | algorithm | seed | success before | success after (95% CI) | steps | wall min | threads "
        "| format warm start | solver warm start | optimum (VI) |"
    )
    lines = [header, "|" + "---|" * 11]
    for c in sorted(curves, key=lambda c: (c.task, c.algo, c.seed)):
        before = rate(c.success[0], c.ci_low[0], c.ci_high[0]) if c.steps and c.steps[0] == 0 else "-"
        after = (
            rate(c.success[-1], c.ci_low[-1], c.ci_high[-1]) + f" @ {c.steps[-1]}"
            if c.steps and c.steps[-1] > 0
            else "-"
        )
        refs = [reference_cell(c.references, kind) for kind in ("format", "solver", "optimal")]
        cells = [
            c.task,
            c.algo,
            str(c.seed),
            before,
            after,
            str(c.last_step),
            f"{c.minutes_total:.1f}",
            "-" if c.threads is None else str(c.threads),
            *refs,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mean_table(curves: list[Curve]) -> str:
    """Per task and algorithm: the final success averaged over seeds, with the seeds' range."""
    lines = ["| task | algorithm | seeds | mean success after | min .. max |", "|" + "---|" * 5]
    groups: dict[tuple[str, str], list[float]] = {}
    for c in curves:
        if c.steps and c.steps[-1] > 0:
            groups.setdefault((c.task, c.algo), []).append(c.success[-1])
    for (task, algo), finals in sorted(groups.items()):
        mean = sum(finals) / len(finals)
        lines.append(
            f"| {task} | {algo} | {len(finals)} | {mean:.3f} | {min(finals):.3f} .. {max(finals):.3f} |"
        )
    return "\n".join(lines) + "\n"


RunLooks = dict[tuple[str, int], tuple[str, str]]  # (algo, seed) -> (color, marker or line style)


def run_looks(curves: list[Curve], seed_looks: str | tuple[str, ...]) -> RunLooks:
    """(algo, seed) -> (color, look): a color per algorithm and one of `seed_looks` (markers or line
    styles) per seed, taken over all of a task's curves so that a run has its color in every figure."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    algos, seeds = sorted({c.algo for c in curves}), sorted({c.seed for c in curves})
    return {
        (c.algo, c.seed): (
            colors[algos.index(c.algo) % len(colors)],
            seed_looks[seeds.index(c.seed) % len(seed_looks)],
        )
        for c in curves
    }


def plot_task(task: str, curves: list[Curve], out: Path) -> None:
    """Success vs wall minutes (left) and vs steps (right), CI bands, reference lines."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    looks = run_looks(curves, "os^Dv<>p")
    for c in sorted(curves, key=lambda c: (c.algo, c.seed)):
        color, marker = looks[c.algo, c.seed]
        for ax, x in zip(axes, (c.minutes, c.steps), strict=True):
            ax.plot(x, c.success, marker=marker, markersize=4, color=color, label=f"{c.algo} s{c.seed}")
            low, high = (np.array(ci, dtype=float) for ci in (c.ci_low, c.ci_high))  # None -> NaN: no band
            ax.fill_between(x, low, high, color=color, alpha=0.12)
    references = curves[0].references
    styles = {
        "format": ("format warm start", ":"),
        "solver": ("solver warm start", "--"),
        "optimal": ("optimum (VI)", "-."),
    }
    for kind, (label, style) in styles.items():
        value = references.get(kind)
        if value is not None:
            for ax in axes:
                ax.axhline(reference_rate(value)[0], color="gray", linestyle=style, linewidth=1, label=label)
    axes[0].set(
        xlabel="RL wall time (minutes)", ylabel="validation success", title=f"{task}: success vs wall time"
    )
    axes[1].set(xlabel="RL steps", title=f"{task}: success vs steps")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[1].legend(unique.values(), unique.keys(), fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_training(task: str, curves: list[Curve], out: Path) -> None:
    """TRAINING_METRICS against the step, one panel each, one line per algorithm/seed that logged them
    (an algorithm keeps its color of plot_task's figure)."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    looks = run_looks(curves, ("-", "--", ":", "-."))
    for c in sorted((c for c in curves if c.training), key=lambda c: (c.algo, c.seed)):
        color, style = looks[c.algo, c.seed]
        for ax, key in zip(axes.flat, TRAINING_METRICS, strict=True):
            values = np.array(c.training[key], dtype=float)  # None -> NaN: a gap in the line
            ax.plot(c.training["step"], values, style, color=color, linewidth=1, label=f"{c.algo} s{c.seed}")
    for ax, title in zip(axes.flat, TRAINING_METRICS.values(), strict=True):
        ax.set_title(f"{task}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[1, 0].set_xlabel("RL steps")
    axes[1, 1].set_xlabel("RL steps")
    axes[0, 0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def summarize(curves: list[Curve], results: Path) -> None:
    if not curves:
        raise SystemExit(f"no curves: no run folder with a metrics.jsonl and no {CURVES_FILE} given")
    results.mkdir(parents=True, exist_ok=True)
    curves_json = json.dumps([asdict(c) for c in curves], indent=1, allow_nan=False)
    (results / CURVES_FILE).write_text(curves_json + "\n")
    table = markdown_table(curves) + "\n" + mean_table(curves)
    (results / "learning.md").write_text(
        "# Learning benchmark (bench/learning.py)\n\nValidation success on held-out levels; after = the "
        "last validation (@ its step); threads = torch threads per rank ('-': not logged, runs before "
        "2026-12-04). References: the warm starts' own evaluation (vagen.pretrain.sft) and the "
        "value-iteration optimum where the env has one. The curves are in curves.json beside this file; "
        "`--summarize-only curves.json NEW_RUN_FOLDERS` adds runs to them; runs.md, where present, is the "
        "hand-kept account of how the runs were made.\n\n" + table
    )
    print(table)
    for task in sorted({c.task for c in curves}):
        task_curves = [c for c in curves if c.task == task]
        out = results / f"learning_{task}.png"
        plot_task(task, task_curves, out)
        print(f"wrote {out}")
        if any(c.training for c in task_curves):
            out = results / f"training_{task}.png"
            plot_training(task, task_curves, out)
            print(f"wrote {out}")
    print(f"wrote {results / 'learning.md'}")


# ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASK_RECIPES), help="recipe names or YAML paths")
    parser.add_argument("--algos", nargs="+", default=["gae"], help=f"any of {ALGORITHMS}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--minutes", type=float, default=None, help="RL minutes per run (default: per task, 30 / Sokoban 60)"
    )
    parser.add_argument("--steps", type=int, default=100_000, help="trainer.steps (the other budget)")
    parser.add_argument("--val-every", type=int, default=10, help="validate every N steps")
    parser.add_argument("--val-levels", type=int, default=512, help="held-out validation levels")
    parser.add_argument("--runs-root", default="runs/bench_learning", help="where run folders go")
    parser.add_argument("--results", default=str(REPO / "bench" / "results"), help="table and plots")
    parser.add_argument(
        "--label",
        help="names a variant run with extra overrides: its rows, curves and folders read ALGO/LABEL",
    )
    parser.add_argument("--no-solver", action="store_true", help="skip the solver warm-start reference")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument(
        "--summarize-only",
        nargs="+",
        type=Path,
        metavar="SOURCE",
        help=f"table + plots from run folders and earlier summaries' {CURVES_FILE} (later ones win)",
    )
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides for every run (after --)")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.summarize_only:
        summarize(read_curves(args.summarize_only), Path(args.results))
        return
    for algo in args.algos:
        algorithm_overrides(algo)  # unknown modifiers stop here, before any run
    runs = plan_runs(args)
    from vagen.config import ConfigError, load_config

    for run in runs:  # a bad override stops here, before hours of runs
        try:
            load_config(REPO / run.recipe, run.overrides)
        except ConfigError as err:
            raise SystemExit(f"{run.task} {run.algo}: config error: {err}") from None
    threads = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]  # OpenMP also takes "4,2" (nested)
    if threads.isdigit() and int(threads) < (os.cpu_count() or 1):  # the budgets are wall time
        print(f"note: OMP_NUM_THREADS={threads}: each timed run uses {threads} of {os.cpu_count()} CPUs")
    execute(runs, with_solver=not args.no_solver, dry_run=args.dry_run)
    if not args.dry_run:
        summarize(read_curves([REPO / run.run_dir for run in runs]), Path(args.results))


if __name__ == "__main__":
    main()
