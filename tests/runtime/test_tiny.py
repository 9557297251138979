"""The bundled tiny model, its tokenizer and the toy task."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the tiny model needs the runtime extra (transformers)")
pytest.importorskip("pyarrow", reason="the toy dataset is written as parquet (pyarrow)")

from rlplan.runtime import tiny  # noqa: E402

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny.ensure_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_tokenizer_round_trips_text_exactly(tokenizer):
    text = "Repeat the letter c: héllo wörld ✓ 12+345 #### 357 don't\n\tend"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_saved_tokenizer_encodes_like_the_one_built_in_memory(tokenizer):
    # AutoTokenizer reloads a qwen2 model's tokenizer as Qwen2Tokenizer; it must not re-split text.
    built = tiny.build_tokenizer()
    text = "<|im_start|>user\nRepeat the letter b: 2024 apples cost 3.50<|im_end|>\n"
    assert tokenizer(text)["input_ids"] == built(text)["input_ids"]
    assert len(tokenizer) == len(built) <= tiny.VOCAB_TARGET


def test_special_tokens_are_single_ids_with_pad_and_eos_set(tokenizer):
    for token in tiny.SPECIAL_TOKENS:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer.pad_token == tiny.PAD_TOKEN
    assert tokenizer.eos_token == tiny.IM_END
    assert tokenizer.padding_side == "left"


def test_chat_template_renders_chatml_with_generation_prompt(tokenizer):
    text = tokenizer.apply_chat_template(tiny.toy_messages("c"), add_generation_prompt=True, tokenize=False)
    assert text == (
        f"<|im_start|>system\n{tiny.TOY_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nRepeat the letter c:<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_left_padding_puts_pad_ids_before_the_prompt(tokenizer):
    batch = tokenizer(["a", "a longer prompt"], padding=True)
    short = batch["input_ids"][0]
    assert short[0] == tokenizer.pad_token_id and short[-1] != tokenizer.pad_token_id
    assert batch["attention_mask"][0][0] == 0


def test_model_config_fits_vllm_cpu_and_the_tokenizer(model_dir, tokenizer):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"] == 64
    assert config["vocab_size"] >= len(tokenizer)
    assert config["eos_token_id"] == tokenizer.eos_token_id
    assert (model_dir / "model.safetensors").exists()


def test_weights_are_bf16_and_the_seed_decides_them(model_dir, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")
    assert {str(tensor.dtype) for tensor in weights.values()} == {"torch.bfloat16"}
    same = load_file(tiny.build_tiny_model(tmp_path / "same", seed=0) / "model.safetensors")
    other = load_file(tiny.build_tiny_model(tmp_path / "other", seed=1) / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert weights[name].equal(same[name])
    assert not weights[name].equal(other[name])


def test_ensure_tiny_model_reuses_the_built_directory(model_dir):
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert tiny.ensure_tiny_model(model_dir.parent) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("answer", "letter", "expected"),
    [
        ("c", "c", 1.0),
        ("c c c", "c", 1.0),
        (" cc and more", "c", 0.5 * 5 / 9 + 0.5 * 2 / 9),
        ("a", "c", 0.5),
        ("z", "c", 0.0),
        ("", "c", 0.0),
        ("123", "c", 0.0),
    ],
)
def test_toy_score_gives_credit_per_letter_and_most_for_the_prompted_one(answer, letter, expected):
    assert tiny.toy_score(answer, letter) == pytest.approx(expected)


def test_toy_dataset_parquet_and_jsonl_hold_the_same_verl_rows(tmp_path):
    import pyarrow.parquet as pq

    parquet_path, jsonl_path = tiny.write_toy_dataset(tmp_path / "toy.parquet", num_prompts=12, seed=3)
    from_parquet = pq.read_table(parquet_path).to_pylist()
    from_jsonl = [json.loads(line) for line in jsonl_path.read_text().splitlines()]
    assert from_parquet == from_jsonl == tiny.toy_records(12, 3)
    row = from_parquet[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["reward_model"]["style"] == "rule"
    letter = row["reward_model"]["ground_truth"]
    assert letter in tiny.TOY_LETTERS and f"letter {letter}:" in row["prompt"][-1]["content"]


def test_tiny_plan_describes_the_tiny_model(model_dir):
    plan = tiny.tiny_plan(model_dir, lora_rank=8)
    assert plan.model.arch.head_dim == 64 and plan.model.arch.num_kv_heads == 2
    assert plan.model.lora.rank == 8


def test_a_benchmark_sized_model_has_the_asked_width_depth_and_a_128_token_vocabulary(tmp_path):
    """benchmarks/versus_trl.py's model: the same kind, 8 layers x 512 wide, a vocabulary under the 256 bytes."""
    from transformers import AutoTokenizer

    model_dir = tiny.build_tiny_model(tmp_path / "bench", num_layers=8, vocab_size=128, hidden_size=512,
                                      intermediate_size=1280, num_kv_heads=4)
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (8, 512, 128)
    assert config["num_attention_heads"] * config["head_dim"] == 512 and config["head_dim"] == 64
    loaded = AutoTokenizer.from_pretrained(model_dir)
    assert len(loaded) <= 128
    # The toy task and the chat template stay encodable, and decode back exactly.
    ids = loaded.apply_chat_template(tiny.toy_messages("c"), add_generation_prompt=True, tokenize=False)
    assert loaded.decode(loaded(ids, add_special_tokens=False)["input_ids"]) == ids
    assert max(loaded(ids)["input_ids"]) < 128
