"""The tiny models, loading, processors, scoring and the critic (vagen.models)."""

import hashlib
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from vagen.models.adapters.qwen_vl import QwenVL
from vagen.models.loading import ValueModel, checkpoint_state_dict, load_policy, load_processor
from vagen.models.scoring import token_logprobs, token_values
from vagen.models.tiny import ASSETS, build_tiny_model, resolve_model_path
from vagen.models.vision import VisionInputs, encode_images, split_by_rows

QWEN_TEMPLATE = ASSETS / "qwen2_5_vl_chat_template.jinja"  # the one Qwen2.5-VL checkpoints ship


@pytest.fixture(scope="module")
def vlm(tiny_vlm_path):
    return load_policy(tiny_vlm_path)


def random_image(rng, size):
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def conversation(rng, turns, size):
    """A multi-turn chat with one image per user turn, and its images."""
    messages, images = [], []
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Turn {turn}."}]}
        )
        messages.append({"role": "assistant", "content": "<think>go</think><answer>Up</answer>" * (turn + 1)})
        images.append(random_image(rng, size))
    return messages, images


def right_padded(encodings):
    """Processor outputs of single rows -> (input_ids, attention_mask) (B, L) and all rows' images."""
    length = max(e["input_ids"].shape[1] for e in encodings)
    input_ids = torch.zeros(len(encodings), length, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, e in enumerate(encodings):
        input_ids[row, : e["input_ids"].shape[1]] = e["input_ids"][0]
        attention_mask[row, : e["input_ids"].shape[1]] = 1
    vision = VisionInputs(
        torch.cat([e["pixel_values"] for e in encodings]), torch.cat([e["image_grid_thw"] for e in encodings])
    )
    return input_ids, attention_mask, vision


def test_build_is_deterministic_per_seed(tmp_path):
    digest = {}
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        build_tiny_model("tiny-vlm", tmp_path / name, seed=seed)
        digest[name] = hashlib.sha256((tmp_path / name / "model.safetensors").read_bytes()).hexdigest()
    assert digest["a"] == digest["b"] != digest["c"]


def test_tiny_vlm_size_tokens_and_image_grid(vlm):
    model, processor = vlm
    assert 0.7e6 < sum(p.numel() for p in model.parameters()) < 1.0e6
    tokenizer = processor.tokenizer
    specials = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
    ]
    assert tokenizer.convert_tokens_to_ids(specials) == [0, 1, 2, 3, 4, 5]
    assert model.config.image_token_id == 5 and tokenizer.eos_token == "<|im_end|>"
    # One 28-px cell = one merged token, no resizing from 56 px up to 280 px (10x10 grid).
    rng = np.random.default_rng(0)
    for size, tokens in [(112, 16), (168, 36), (280, 100)]:
        vision = encode_images(processor, QwenVL(), [np.asarray(random_image(rng, size))])
        assert vision.image_grid_thw.tolist() == [[1, size // 14, size // 14]]
        assert QwenVL().image_token_counts(model.config, vision).tolist() == [tokens]
    assert encode_images(processor, QwenVL(), []) is None


def test_text_model_loads_through_causal_lm_path(tiny_text_path):
    model, tokenizer = load_policy(tiny_text_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\nGo Left<|im_end|>")])
    logp, entropy = token_logprobs(
        model, ids, torch.ones_like(ids), None, micro_batch_size=1, with_entropy=True
    )
    assert logp.shape == ids.shape and logp[0, 0] == 0 and (logp[0, 1:] < 0).all()
    assert (entropy[0, 1:] > 0).all() and (entropy[0, 1:] <= np.log(1024) + 1e-4).all()


@pytest.mark.parametrize("template", ["ours", "qwen2.5-vl"])
def test_chat_template_prefix_property(tiny_vlm_path, tmp_path, template):
    """Rendering turns 1..t (+ generation prompt) is a prefix of rendering 1..t+1, in text and in ids."""
    path = tiny_vlm_path
    if template == "qwen2.5-vl":
        path = tmp_path / "qwen-template"
        shutil.copytree(tiny_vlm_path, path)
        shutil.copyfile(QWEN_TEMPLATE, path / "chat_template.jinja")
    processor = load_processor(path)
    messages, images = conversation(np.random.default_rng(1), turns=3, size=112)
    for end in range(1, len(messages)):
        before = processor.apply_chat_template(
            messages[:end], tokenize=False, add_generation_prompt=end % 2 == 1
        )
        after = processor.apply_chat_template(messages[: end + 1], tokenize=False)
        assert after.startswith(before)
        ids_before = processor(text=[before], images=images[: (end + 1) // 2])["input_ids"][0]
        ids_after = processor(text=[after], images=images[: (end + 2) // 2])["input_ids"][0]
        assert list(ids_after[: len(ids_before)]) == list(ids_before)
    if template == "ours":
        assert not before.startswith("<|im_start|>system")  # no default system prompt
    else:
        assert before.startswith("<|im_start|>system\nYou are a helpful assistant.")
        load_policy(path)  # the whole load path accepts the real template too


def test_load_errors_are_clear(tmp_path, tiny_vlm_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_policy("Qwen/Qwen2.5-VL-3B-Instruct")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_vlm_path, broken)
    (broken / "model.safetensors").unlink()
    (broken / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing: weights .*; tokenizer"):
        load_policy(broken)
    with pytest.raises(ValueError, match="dtype"):
        load_policy(tiny_vlm_path, dtype="fp8")
    assert resolve_model_path(tiny_vlm_path) == tiny_vlm_path


def test_padded_micro_batched_scoring_equals_each_sequence_alone(vlm):
    """Multi-turn, multi-image rows of different lengths, right-padded, 2 rows per micro-batch."""
    model, processor = vlm
    rng = np.random.default_rng(2)
    encodings = []
    for turns, size in [(1, 112), (3, 168), (2, 112)]:
        messages, images = conversation(rng, turns, size)
        text = processor.apply_chat_template(messages, tokenize=False)
        encodings.append(processor(text=[text], images=images, return_tensors="pt"))
    input_ids, attention_mask, vision = right_padded(encodings)
    with torch.no_grad():
        logp, entropy = token_logprobs(
            model, input_ids, attention_mask, vision, micro_batch_size=2, with_entropy=True
        )
        for row, e in enumerate(encodings):
            # Reference: the model's own forward on the processor's output (its M-RoPE positions).
            logits = model(**e).logits[0, :-1].float()
            ids = e["input_ids"][0]
            expected = torch.log_softmax(logits, -1).gather(1, ids[1:, None]).squeeze(1)
            expected_entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
            length = len(ids)
            assert (
                logp[row, 0] == 0 and (logp[row, length:] == 0).all() and (entropy[row, length:] == 0).all()
            )
            torch.testing.assert_close(logp[row, 1:length], expected, atol=1e-5, rtol=0)
            torch.testing.assert_close(entropy[row, 1:length], expected_entropy, atol=1e-5, rtol=0)


def test_scoring_applies_temperature_and_carries_gradients(vlm):
    model, processor = vlm
    messages, images = conversation(np.random.default_rng(3), turns=1, size=112)
    e = processor(
        text=[processor.apply_chat_template(messages, tokenize=False)], images=images, return_tensors="pt"
    )
    vision = VisionInputs(e["pixel_values"], e["image_grid_thw"])
    logp, _ = token_logprobs(model, e["input_ids"], e["attention_mask"], vision, 1, False, temperature=0.5)
    logits = model(**e).logits[0, :-1] / 0.5
    expected = torch.log_softmax(logits, -1).gather(1, e["input_ids"][0, 1:, None]).squeeze(1)
    torch.testing.assert_close(logp[0, 1:], expected, atol=1e-5, rtol=0)
    logp.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_value_model_from_policy_save_load(vlm, tiny_vlm_path, tmp_path):
    _, processor = vlm
    critic = ValueModel.from_pretrained(tiny_vlm_path)
    rng = np.random.default_rng(4)
    encodings = []
    for turns in (1, 2):
        messages, images = conversation(rng, turns, 112)
        text = processor.apply_chat_template(messages, tokenize=False)
        encodings.append(processor(text=[text], images=images, return_tensors="pt"))
    input_ids, attention_mask, vision = right_padded(encodings)
    with torch.no_grad():
        assert (
            token_values(critic, input_ids, attention_mask, vision, 2) == 0
        ).all()  # zero-initialised head
        torch.nn.init.normal_(critic.value_head.weight, std=0.1)
        values = token_values(critic, input_ids, attention_mask, vision, micro_batch_size=1)
        assert values.shape == input_ids.shape and values.dtype == torch.float32
        real = attention_mask.bool() & (torch.arange(input_ids.shape[1]) > 0)
        assert (values[~real] == 0).all() and values[real].abs().min() > 0
        # aligned with token_logprobs: V at token i is the critic's output at i - 1 (before token i)
        first = encodings[0]
        alone = critic(
            first["input_ids"],
            first["attention_mask"],
            VisionInputs(first["pixel_values"], first["image_grid_thw"]),
        )[0]
        length = first["input_ids"].shape[1]
        torch.testing.assert_close(values[0, 1:length], alone[: length - 1], atol=1e-5, rtol=0)
        critic.save_pretrained(tmp_path / "critic")
        reloaded = ValueModel.from_pretrained(tmp_path / "critic")
        torch.testing.assert_close(
            token_values(reloaded, input_ids, attention_mask, vision, micro_batch_size=2),
            values,
            atol=1e-5,
            rtol=0,
        )


def test_lora_trains_adapters_only_and_exports_merged_weights(tiny_vlm_path):
    model, _ = load_policy(tiny_vlm_path, lora={"r": 4, "lora_alpha": 8}, gradient_checkpointing=True)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name and "visual" not in name for name in trainable)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)  # peft starts B at 0 (a no-op adapter); make the merge visible
    base, _ = load_policy(tiny_vlm_path)
    exported = checkpoint_state_dict(model)
    assert set(exported) == set(base.state_dict())
    changed = [k for k in exported if not torch.equal(exported[k], base.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") and "visual" not in k for k in changed)


def test_qwen_vl_utils_and_processor_work_on_cpu_install():
    """PyPI's CUDA torchvision imports beside CPU torch (the shim), so qwen-vl-utils' image path works."""
    import torchvision  # noqa: F401
    from qwen_vl_utils import process_vision_info

    image = Image.new("RGB", (280, 280), (200, 230, 255))
    images, videos = process_vision_info([{"role": "user", "content": [{"type": "image", "image": image}]}])
    assert videos is None and images[0].size == (280, 280)


def test_torchvision_shim_forwards_working_registrations():
    """On a machine where torchvision's ops exist (GPU), the wrapped register_fake must behave like the
    original; only a registration for a missing torchvision:: op is tolerated."""
    import torchvision  # noqa: F401  (arms the wrapper)
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert getattr(torch.library.register_fake, "_vagen_shim", False)
    torch.library.define("torchvision::vagen_shim_probe", "(Tensor x) -> Tensor")
    torch.library.impl("torchvision::vagen_shim_probe", "cpu", lambda x: x * 2)
    calls = []

    @torch.library.register_fake("torchvision::vagen_shim_probe")
    def _fake(x):
        calls.append(x.shape)
        return torch.empty_like(x)

    with FakeTensorMode():
        torch.ops.torchvision.vagen_shim_probe(torch.empty(3))
    assert calls == [torch.Size([3])]
    assert torch.ops.torchvision.vagen_shim_probe(torch.ones(2)).tolist() == [2.0, 2.0]

    def fake_for_missing_op(x):
        return x

    assert (
        torch.library.register_fake("torchvision::vagen_no_such_op", fake_for_missing_op)
        is fake_for_missing_op
    )
    with pytest.raises(RuntimeError):  # other namespaces are not shielded
        torch.library.register_fake("vagen_test::no_such_op", fake_for_missing_op)


def test_images_are_matched_to_rows_by_pad_tokens(vlm):
    _, processor = vlm
    rng = np.random.default_rng(5)
    vision = encode_images(
        processor, QwenVL(), [random_image(rng, 112), random_image(rng, 168), random_image(rng, 112)]
    )
    pad = 5
    rows = torch.tensor([[1] + [pad] * 16 + [pad] * 36, [1] * 37 + [pad] * 16])  # images 0+1, then image 2
    parts = split_by_rows(rows, vision, [16, 36, 16], image_token_id=pad)
    assert [p.image_grid_thw.tolist() for p in parts] == [[[1, 8, 8], [1, 12, 12]], [[1, 8, 8]]]
    torch.testing.assert_close(VisionInputs.cat(parts).pixel_values, vision.pixel_values)
    with pytest.raises(ValueError, match="do not match whole images"):
        split_by_rows(rows[:, :20], vision, [16, 36, 16], image_token_id=pad)
