"""GIFs and the per-step HTML viewer written from episode records."""

import imageio.v3 as iio
import numpy as np

from vagen.rollout.batch import EpisodeRecord, TurnRecord
from vagen.viz.gif import episode_frames, write_episode_gif
from vagen.viz.html import write_step_page


def turn(reply: str, frame, reward: float) -> TurnRecord:
    return TurnRecord(
        observation="Current observation:\n#####\n#@$.#\n#####",
        frame=frame,
        reply=reply,
        finish_reason="stop",
        num_tokens=9,
        format_ok=True,
        actions=["Right"],
        num_invalid=1,
        env_reward=reward,
        reasoning_reward=0.0,
        grounding=None,
        worldmodel=None,
        reward=reward,
        state="#####\n#@$.#\n#####",
    )


def episode(num_turns: int, visual: bool) -> EpisodeRecord:
    frame = np.zeros((112, 84, 3), np.uint8) if visual else None
    turns = [
        turn(f"<think>step {t} " + "long words " * 40 + "</think><answer>Right</answer>", frame, 0.5)
        for t in range(num_turns)
    ]
    return EpisodeRecord(
        group=0,
        member=1,
        level_seed=7,
        dynamics_seed=3,
        turns=turns,
        final_frame=frame,
        final_state="###\n#+#",
        episode_return=0.5 * num_turns,
        success=True,
        num_actions=num_turns,
        end_reason="success",
    )


def test_gif_has_one_frame_per_turn_plus_the_outcome(tmp_path):
    for visual in (True, False):
        frames = episode_frames(episode(3, visual))
        assert len(frames) == 4 and len({f.shape for f in frames}) == 1
        assert frames[0].std() > 0  # something was drawn
        path = write_episode_gif(episode(3, visual), tmp_path / f"ep_{visual}.gif")
        assert iio.imread(path, index=None).shape[0] == 4


def test_step_page_indexes_every_gif_with_full_replies(tmp_path):
    episodes = [episode(2, True), episode(1, False)]
    episodes[1].turns[0].reply = "<answer>a < b & c</answer>"
    page = write_step_page(tmp_path, step=5, episodes=episodes)
    html = page.read_text()
    assert page == tmp_path / "step_000005" / "index.html"
    assert html.count("<img src='episode_") == 2 and "long words " * 40 in html
    assert "a &lt; b &amp; c" in html  # replies are escaped, shown in full
    assert [
        iio.imread(tmp_path / "step_000005" / f"episode_00{i}.gif", index=None).shape[0] for i in (0, 1)
    ] == [3, 2]
    write_step_page(tmp_path, step=6, episodes=episodes[:1])
    assert (tmp_path / "index.html").read_text().count("<li>") == 2
