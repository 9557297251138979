"""Training tokens/s: the runtime's actor update beside a raw torch forward/backward, same model and batch.

    .venv/bin/python benchmarks/training_throughput.py [--model-dir DIR] [--world-size 1] [--sequences 16]
        [--prompt-len 32] [--response-len 32] [--repeats 3] [--lora-rank 8] [--compute-dtype auto]

The runtime side is `PolicyTrainer.update` (FSDP2, packing, PPO loss, clipping, AdamW) on
`--world-size` local ranks, three ways: packed with the CPU's per-sequence (varlen) attention, packed
with sdpa over one block-diagonal mask (what packing cost before the varlen path), and padded. Each rank
holds the three trainers and times their updates in turn, repeat after repeat, so a shared machine's
changing load falls on all three alike; the median repeat is reported. The baseline is a plain Hugging
Face model in one process: one padded forward, a log-softmax gather loss, backward and an AdamW step
over all the ranks' sequences at once, on as many intra-op threads as the ranks use together (each rank
gets its share of the cores, as the Ray workers do), so both sides have the same cores and the same
tokens. Each rank gets `--sequences` sequences. Without --model-dir the bundled tiny Qwen2 is built in a
temp dir.

Both sides compute in `--compute-dtype`: `auto` is what `rlplan solve --device cpu` picks for this CPU
(bfloat16 where it has native bf16, AVX512-BF16 or AMX; float32 elsewhere). In bf16 the runtime all-gathers
bf16 copies of its fp32 shards (FSDP2's MixedPrecisionPolicy, as verl), and the raw torch baseline keeps
fp32 weights and AdamW and runs its forward under `torch.autocast("cpu", torch.bfloat16)`, as the Hugging
Face Trainer does with `bf16=True`.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def _batch(sequences: int, prompt_len: int, response_len: int, vocab: int, seed: int):
    import torch

    from rlplan.runtime.trainer.token_batch import token_batch_from_sequences

    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, vocab, (sequences, prompt_len), generator=generator).tolist()
    responses = torch.randint(5, vocab, (sequences, response_len), generator=generator).tolist()
    batch = token_batch_from_sequences(prompts, responses)
    mask = batch.response_mask
    return batch.with_fields(advantages=torch.randn(mask.shape, generator=generator) * mask)


# label -> (use_remove_padding, attention implementation forced on the model, "default" for the runtime's own)
VARIANTS = {
    "packed, varlen attention": (True, "default"),
    "packed, block-diagonal mask": (True, "sdpa"),
    "padded": (False, "default"),
}


def _runtime_rank(rank: int, world_size: int, args: dict) -> dict:
    import statistics

    import attrs
    import torch

    from rlplan.runtime.demo_workload import demo_plan
    from rlplan.runtime.platform import cpu_threads_per_rank
    from rlplan.runtime.trainer.policy import PolicyTrainer

    torch.set_num_threads(cpu_threads_per_rank(world_size))  # as the Ray trainer workers do
    plan = demo_plan(args["model_dir"], "unused.parquet", "unused", steps=1, world_size=world_size)
    per_rank = args["sequences"]
    plan = plan.evolve(
        model=attrs.evolve(plan.model, lora=attrs.evolve(plan.model.lora, rank=args["lora_rank"])),
        data=attrs.evolve(plan.data, train_batch_size=per_rank * world_size, max_prompt_length=args["prompt_len"],
                          max_response_length=args["response_len"]),
        actor=attrs.evolve(plan.actor, ppo_mini_batch_size=per_rank * world_size, ppo_micro_batch_size_per_gpu=per_rank,
                           use_kl_loss=False, compute_dtype=args["compute_dtype"]),
        rollout=attrs.evolve(plan.rollout, n=1),
    )
    trainers = {}
    for label, (remove_padding, attention) in VARIANTS.items():
        variant = plan.evolve(model=attrs.evolve(plan.model, use_remove_padding=remove_padding))
        trainers[label] = PolicyTrainer(variant, device=torch.device("cpu"), device_type="cpu", rank=rank)
        if attention != "default":
            trainers[label].model.set_attn_implementation(attention)
    batch = _batch(per_rank, args["prompt_len"], args["response_len"], plan.model.arch.vocab_size, seed=rank)
    old, _ = trainers["padded"].compute_log_probs(batch)
    batch = batch.with_fields(old_log_probs=old)
    for trainer in trainers.values():
        trainer.update(batch, step=0)  # warm-up
    seconds: dict[str, list[float]] = {label: [] for label in trainers}
    for step in range(args["repeats"]):
        for label, trainer in trainers.items():
            start = time.perf_counter()
            trainer.update(batch, step=step + 1)
            seconds[label].append(time.perf_counter() - start)
    return {"tokens": int(batch["sequence_lengths"].sum()),
            "seconds": {label: statistics.median(times) for label, times in seconds.items()}}


def _raw_torch(args: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args["threads"])
    model = AutoModelForCausalLM.from_pretrained(args["model_dir"], dtype=torch.float32)
    if args["lora_rank"]:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args["lora_rank"], lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = _batch(args["sequences"] * args["world_size"], args["prompt_len"], args["response_len"],
                   model.config.vocab_size, seed=0)
    input_ids = batch["input_ids"]
    prompt = args["prompt_len"]

    def one_step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args["compute_dtype"] == "bfloat16"):
            logits = model(input_ids=input_ids, use_cache=False).logits[:, prompt - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, prompt:, None]).squeeze(-1)
        loss = -(logp * batch["advantages"]).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    one_step()
    start = time.perf_counter()
    for _ in range(args["repeats"]):
        one_step()
    return {"tokens": int(batch["sequence_lengths"].sum()), "seconds": (time.perf_counter() - start) / args["repeats"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=16, help="sequences per rank")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--compute-dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="both sides' compute dtype; auto: what the solver picks for this CPU")
    options = parser.parse_args()

    from rlplan.planner.commands.this_machine import this_machine_compute_dtype
    from rlplan.runtime.platform import cpu_threads_per_rank
    from rlplan.runtime.tiny import ensure_tiny_model
    from rlplan.runtime.trainer.local_group import run_on_local_group

    model_dir = options.model_dir or str(ensure_tiny_model(tempfile.mkdtemp(prefix="rlplan-bench-")))
    args = {
        "model_dir": model_dir,
        "sequences": options.sequences,
        "prompt_len": options.prompt_len,
        "response_len": options.response_len,
        "repeats": options.repeats,
        "lora_rank": options.lora_rank,
        "world_size": options.world_size,
        "threads": options.world_size * cpu_threads_per_rank(options.world_size),
        "compute_dtype": options.compute_dtype if options.compute_dtype != "auto" else this_machine_compute_dtype(),
    }
    ranks = run_on_local_group(_runtime_rank, options.world_size, args)
    tokens = sum(r["tokens"] for r in ranks)
    runtime = {label: (tokens, max(r["seconds"][label] for r in ranks)) for label in VARIANTS}
    raw = _raw_torch(args)
    print(f"model {model_dir}, lora rank {options.lora_rank}, {options.sequences} sequences x "
          f"{options.prompt_len}+{options.response_len} tokens per rank, {options.repeats} timed repeats (median), "
          f"computing in {args['compute_dtype']}")
    print(f"{'':52}{'tokens/s':>12}{'s/update':>12}")
    for variant, (tokens, seconds) in runtime.items():
        label = f"runtime update, {options.world_size} rank(s), {variant}"
        print(f"{label:52}{tokens / seconds:12.0f}{seconds:12.3f}")
    label = f"raw torch fwd/bwd/AdamW, padded, {args['threads']} thread(s)"
    print(f"{label:52}{raw['tokens'] / raw['seconds']:12.0f}{raw['seconds']:12.3f}")


if __name__ == "__main__":
    main()
