"""Train the tiny models' byte-level BPE tokenizer and write it to assets/tiny/ (deterministic).

    .venv/bin/python scripts/train_tokenizer.py [--vocab-size 1024] [--out assets/tiny]

The corpus is the text our agents read and write: the environments' system prompts and observations
(from `envs_visual.language` when it is importable) plus a synthetic corpus of format instructions,
reply tags (<think> <observation> <reasoning> <prediction> <answer>), action names and legend words.
The pipeline (NFC, Qwen2's pre-tokenizer regex, byte-level BPE) is exactly the one transformers'
`Qwen2Tokenizer` builds, so the files load through `AutoTokenizer`/`AutoProcessor` unchanged, and
the special tokens are the ones the Qwen2.5-VL processor and chat markup expect, at fixed ids 0..6.
Same corpus + same vocab size -> byte-identical tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[1]

# Order fixes the ids: 0..6. The Qwen2.5-VL config refers to the vision ones by id.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# transformers' Qwen2Tokenizer pre-tokenizer (models/qwen2/tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

ACTIONS = ["Up", "Down", "Left", "Right"]
TAGS = ["think", "observation", "reasoning", "prediction", "answer"]
LEGENDS = {
    "sokoban": {"#": "wall", "_": "floor", "O": "target", "X": "box", "P": "player", "√": "box on target"},
    "frozenlake": {"_": "frozen ice", "O": "hole", "G": "goal", "P": "player", "S": "start"},
}
FORMATS = {
    "free_think": "<think>...</think><answer>...</answer>",
    "no_think": "<answer>...</answer>",
    "grounding": "<observation>...</observation><reasoning>...</reasoning><answer>...</answer>",
    "worldmodeling": "<reasoning>...</reasoning><prediction>...</prediction><answer>...</answer>",
    "grounding_worldmodeling": (
        "<observation>...</observation><reasoning>...</reasoning><prediction>...</prediction>"
        "<answer>...</answer>"
    ),
}
RELATIONS = [
    "above",
    "below",
    "left of",
    "right of",
    "up-left of",
    "up-right of",
    "down-left of",
    "down-right of",
]
OBJECTS = ["box", "target", "goal", "hole", "wall", "player"]
GAME_RULES = {
    "sokoban": (
        "You are a Sokoban solver. Push every box onto a target. You can move Up, Down, Left or Right. "
        "You cannot push a box into a wall or another box, and you cannot pull boxes."
    ),
    "frozenlake": (
        "You are a FrozenLake solver. Walk from the start to the goal without falling into a hole. "
        "The ice may be slippery: you may move in a different direction than intended."
    ),
}


def synthetic_corpus(num_episodes: int = 600, seed: int = 0) -> list[str]:
    """Representative prompts and replies: instructions, observations, well- and ill-formed answers."""
    rng = random.Random(seed)
    lines = []
    for game, rules in GAME_RULES.items():
        legend = ", ".join(f"{symbol}: {name}" for symbol, name in LEGENDS[game].items())
        for name, layout in FORMATS.items():
            lines.append(
                f"{rules}\nSymbols: {legend}.\nYou can take up to 3 actions per turn, separated by commas.\n"
                f"Reply in the format ({name}): {layout}\nExample: <answer>Up, Left</answer>"
            )
    for _ in range(num_episodes):
        game = rng.choice(list(GAME_RULES))
        size = rng.randint(4, 8)
        symbols = list(LEGENDS[game])
        grid = "\n".join("".join(rng.choice(symbols) for _ in range(size)) for _ in range(size))
        turn = rng.randint(1, 10)
        lines.append(
            f"Turn {turn}. Here is the current state: <image>\n{grid}\n"
            f"Reward: {rng.choice(['0', '-0.1', '1', '10', '0.5'])}. "
            f"You have {rng.randint(1, 20)} actions left. "
            "Decide your next action(s)."
        )
        actions = ", ".join(rng.choice(ACTIONS) for _ in range(rng.randint(1, 3)))
        facts = "; ".join(
            f"the {rng.choice(OBJECTS)} is {rng.choice(RELATIONS)} the player"
            for _ in range(rng.randint(1, 3))
        )
        parts = {
            "think": f"The player is at row {rng.randint(0, size)}, column {rng.randint(0, size)}. {facts}. "
            f"I should move {rng.choice(ACTIONS).lower()} first.",
            "observation": f"{facts}.",
            "reasoning": f"To reach the {rng.choice(OBJECTS)} I go {rng.choice(ACTIONS).lower()}.",
            "prediction": f"After the move, {facts}.",
            "answer": actions,
        }
        chosen = rng.choice([["think", "answer"], ["answer"], ["observation", "reasoning", "answer"],
                             ["reasoning", "prediction", "answer"], TAGS[1:]])  # fmt: skip
        lines.append("".join(f"<{tag}>{parts[tag]}</{tag}>" for tag in chosen))
        lines.append(
            f"Invalid action: {rng.choice(['Jump', 'up!', 'north', '5'])}. "
            f"Valid actions: {', '.join(ACTIONS)}."
        )
    return lines


def environment_corpus(seed: int = 0) -> list[str]:
    """What envs_visual.language shows and expects (system prompt, instructions, observations in image
    and text mode, example and random replies) for every env x prompt format, if it is importable."""
    try:
        import gymnasium

        import envs_visual  # noqa: F401  (registers the envs)
        from envs_visual.language import PROMPT_FORMATS, LanguageEnv
    except ImportError:
        return []
    rng = random.Random(seed)
    lines = []
    for env_id in ("envs_visual/Sokoban-v0", "envs_visual/FrozenLake-v0"):
        for prompt_format in sorted(PROMPT_FORMATS):
            for text_only in (False, True):
                lang = LanguageEnv(gymnasium.make(env_id), prompt_format=prompt_format, text_only=text_only)
                for episode in range(3):
                    observation, _ = lang.reset(seed=episode)
                    lines += [lang.system_prompt, observation.text, lang.example_reply()]
                    for _ in range(3):
                        actions = ", ".join(rng.choice(lang.action_names) for _ in range(rng.randint(1, 3)))
                        reply = lang.example_reply().rsplit("<answer>", 1)[0] + f"<answer>{actions}</answer>"
                        observation, _, terminated, truncated, _ = lang.step(reply)
                        lines += [reply, observation.text]
                        if terminated or truncated:
                            break
    return lines


def train_tokenizer(corpus: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def tokenizer_config() -> dict:
    """tokenizer_config.json: the class transformers rebuilds and Qwen2.5-VL's eos/pad choice."""
    added = {
        str(i): {"content": token, "lstrip": False, "rstrip": False, "normalized": False,
                 "single_word": False, "special": True}
        for i, token in enumerate(SPECIAL_TOKENS)
    }  # fmt: skip
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "bos_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "tiny")
    args = parser.parse_args()

    env_lines = environment_corpus()
    corpus = env_lines + synthetic_corpus()
    tokenizer = train_tokenizer(corpus, args.vocab_size)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, token
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    num_tokens = sum(len(tokenizer.encode(line).ids) for line in corpus)
    print(
        f"vocab {tokenizer.get_vocab_size()}, corpus {len(corpus)} lines "
        f"({len(env_lines)} from envs_visual), "
        f"{num_tokens} tokens, {sum(map(len, corpus)) / num_tokens:.2f} chars/token -> {args.out}"
    )


if __name__ == "__main__":
    main()
