"""A static page per training step: each sampled episode's GIF next to its full reply texts, plus a root
index linking the step pages. Open `<out_dir>/index.html` in a browser; no server needed."""

import html
from pathlib import Path

from vagen.rollout.batch import EpisodeRecord
from vagen.viz.gif import write_episode_gif

STYLE = """body{font-family:sans-serif;margin:1em}
.ep{border-top:1px solid #ccc;padding:.5em 0;display:flex;gap:1em}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.4em;margin:.2em 0;max-width:60em}
.ok{color:#060}.bad{color:#a00}"""


def _turn_html(t: int, turn) -> str:
    actions = html.escape(", ".join(turn.actions) or "none")
    status = "ok" if turn.format_ok else "bad"
    return (
        f"<div><b>turn {t + 1}</b> reward {turn.reward:.2f} (env {turn.env_reward:.2f}, reasoning "
        f"{turn.reasoning_reward:.2f}) <span class={status}>format {status}</span>, actions: {actions}, "
        f"{turn.num_tokens} tokens ({turn.finish_reason})<pre>{html.escape(turn.reply)}</pre></div>"
    )


def _episode_html(index: int, episode: EpisodeRecord, gif_name: str) -> str:
    outcome = "ok" if episode.success else "bad"
    turns = "".join(_turn_html(t, turn) for t, turn in enumerate(episode.turns))
    return (
        f"<div class=ep id=ep{index}><img src='{gif_name}' alt='episode {index}'><div>"
        f"<h3>episode {index}: group {episode.group}, member {episode.member}, "
        f"level seed {episode.level_seed}</h3><p class={outcome}>return {episode.episode_return:.2f}, "
        f"{'success' if episode.success else 'no success'} ({html.escape(episode.end_reason)}), "
        f"{len(episode.turns)} turns, {episode.num_actions} actions</p>"
        f"{turns}</div></div>"
    )


def write_step_page(
    out_dir: str | Path, step: int, episodes: list[EpisodeRecord], title: str = "rollout"
) -> Path:
    """Write `<out_dir>/step_<step>/` (one GIF per episode + index.html) and refresh `<out_dir>/index.html`.
    Returns the step page's path."""
    out_dir = Path(out_dir)
    step_dir = out_dir / f"step_{step:06d}"
    body = []
    for index, episode in enumerate(episodes):
        gif = write_episode_gif(episode, step_dir / f"episode_{index:03d}.gif")
        body.append(_episode_html(index, episode, gif.name))
    successes = sum(ep.success for ep in episodes)
    page = step_dir / "index.html"
    page.write_text(
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)} step {step}</title>"
        f"<style>{STYLE}</style>"
        f"<p><a href='../index.html'>all steps</a></p><h1>{html.escape(title)}: step {step}</h1>"
        f"<p>{len(episodes)} episodes, {successes} successes</p>{''.join(body)}"
    )
    steps = sorted(p.parent.name for p in out_dir.glob("step_*/index.html"))
    links = "".join(f"<li><a href='{name}/index.html'>{name}</a></li>" for name in steps)
    (out_dir / "index.html").write_text(
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title><style>{STYLE}</style>"
        f"<h1>{html.escape(title)}</h1><ul>{links}</ul>"
    )
    return page
