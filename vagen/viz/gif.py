"""Episode GIFs: one frame per turn (the image the agent saw, its reply wrapped, the executed actions and
the turn reward) plus a last frame with the final state, the return and the outcome."""

import textwrap
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vagen.rollout.batch import EpisodeRecord

PANEL = 256  # px, the env image is scaled (nearest) into a PANEL x PANEL square
TEXT_WIDTH = 420  # px, right-hand text column
WRAP = 58  # characters per text line
LINE_HEIGHT = 13
MAX_REPLY_LINES = (PANEL - 3 * LINE_HEIGHT) // LINE_HEIGHT - 2


def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default()


def _wrapped(text: str, max_lines: int) -> list[str]:
    lines = [line for paragraph in text.splitlines() for line in textwrap.wrap(paragraph, WRAP) or [""]]
    return lines if len(lines) <= max_lines else [*lines[: max_lines - 1], "..."]


def _state_panel(frame: np.ndarray | None, grid: str) -> Image.Image:
    """The env image scaled to the panel, or (text-only mode) the text grid drawn in it."""
    panel = Image.new("RGB", (PANEL, PANEL), "white")
    if frame is not None:
        image = Image.fromarray(frame)
        scale = PANEL / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        panel.paste(image.resize(size, Image.Resampling.NEAREST), (0, 0))
    else:
        ImageDraw.Draw(panel).multiline_text((6, 6), grid[-600:], fill="black", font=_font())
    return panel


def _frame(state: Image.Image, lines: list[tuple[str, str]]) -> np.ndarray:
    """State panel on the left, coloured text lines on the right; uint8 (PANEL, PANEL + TEXT_WIDTH, 3)."""
    canvas = Image.new("RGB", (PANEL + TEXT_WIDTH, PANEL), (245, 245, 245))
    canvas.paste(state, (0, 0))
    draw = ImageDraw.Draw(canvas)
    for row, (text, colour) in enumerate(lines):
        draw.text((PANEL + 8, 4 + row * LINE_HEIGHT), text, fill=colour, font=_font())
    return np.asarray(canvas)


def episode_frames(episode: EpisodeRecord) -> list[np.ndarray]:
    """len(episode.turns) + 1 frames of equal size, uint8 (H, W, 3)."""
    frames, so_far = [], 0.0
    for t, turn in enumerate(episode.turns):
        so_far += turn.reward
        header = f"turn {t + 1}/{len(episode.turns)}  level {episode.level_seed}  return so far {so_far:.2f}"
        lines = [(header, "black")]
        lines += [(line, "navy") for line in _wrapped(turn.reply, MAX_REPLY_LINES)]
        actions = ", ".join(turn.actions) or "none"
        lines.append(
            (
                f"actions: {actions}" + (f"  ({turn.num_invalid} invalid)" if turn.num_invalid else ""),
                "darkgreen",
            )
        )
        lines.append(
            (f"turn reward {turn.reward:.2f}  (format {'ok' if turn.format_ok else 'bad'})", "darkred")
        )
        frames.append(_frame(_state_panel(turn.frame, turn.state), lines))
    outcome = "SUCCESS" if episode.success else "no success"
    final_lines = [
        (f"final state after {len(episode.turns)} turns, {episode.num_actions} actions", "black"),
        (f"return {episode.episode_return:.2f}   outcome: {outcome} ({episode.end_reason})", "darkred"),
    ]
    frames.append(_frame(_state_panel(episode.final_frame, episode.final_state), final_lines))
    return frames


def write_episode_gif(episode: EpisodeRecord, path: str | Path, seconds_per_frame: float = 1.5) -> Path:
    """Write the episode's GIF (looping); returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = np.stack(episode_frames(episode))  # (T + 1, H, W, 3)
    iio.imwrite(path, frames, extension=".gif", duration=int(seconds_per_frame * 1000), loop=0)
    return path
