"""TRL's GRPOTrainer beside `rlplan run`, one after the other, on the same model, task, batch, lr and seed.

    nox -s versus_trl                       # the issue 12 size: 8 steps of 8 prompts x 8 samples x 128 tokens
    nox -s versus_trl -- --steps 3 --response-len 32 --output result.json
    python benchmarks/versus_trl.py [--sides trl,rlplan,limit] [--steps 8] [--prompts 8] [--n 8] [--response-len 128] [--lengths fixed|free]
        [--lr 1e-5] [--compute-dtype auto|bfloat16|float32]
        [--seed 1] [--world-size 2] [--layers 8] [--hidden 512] [--vocab 128] [--work-dir DIR] [--json]

Both sides train the bundled kind of model (a random Qwen2 built like runtime/tiny.py: `--layers` layers,
`--hidden` wide, 64-wide heads, a `--vocab`-token BPE) in full fine-tuning, fp32 weights, on the toy copy-the-letter
task with its reward (runtime.tiny.toy_score), `--prompts` prompts x `--n` samples of up to
`--response-len` new tokens per step at temperature 1, one optimizer step per RL step (AdamW at `--lr`,
constant, grad clip 1.0), no KL term, token-mean loss aggregation, clip 0.2 / 0.28, advantages normalized
per group. Both compute in `--compute-dtype`: `auto` is what `rlplan solve --device cpu` picks for this CPU,
bfloat16 where it has native bf16 (AVX512-BF16, AMX), else float32. In bf16 rlplan's trainer all-gathers bf16
copies of its fp32 shards and its engine runs in bf16 (as verl on GPUs); TRL runs with `bf16=True` (its own
default, autocast over fp32 weights) -- in float32 rlplan's trainer and engine run in fp32 and TRL with
`bf16=False`. The prompt order differs (each side shuffles its own way from the same seed); the task's
prompts are drawn from the same distribution.

`--lengths fixed` (the default) makes every response exactly `--response-len` tokens on both sides, so both
steps carry the same tokens and the step times compare the systems: rlplan's engine samples past the
end-of-sequence token (verl's `rollout.ignore_eos`), TRL's `generate` may not emit it before the last token
(`min_new_tokens`, the nearest HF knob; TRL masks whatever follows an EOS, so it must not be sampled there).
The task's reward counts shares of letters, so it does not depend on the length. `--lengths free` stops at
EOS on both sides: each step then carries as many tokens as the policy has drifted to, and on this task the
two policies drift apart within a few steps (see docs/benchmarks.md).

- TRL: `GRPOTrainer` with HF `generate`, in one process on every core (`--side trl`, a child process).
- rlplan: `rlplan run` of the plan `rlplan demo` would solve for this workload on `--world-size` CPU ranks.
- limit: the step's synchronous limit (issue 42): raw vLLM `LLM.generate` of the same batch (vLLM's defaults, the
  same model, dtype and seed, every core) and then one raw torch update of it (a padded forward, autocast in bf16
  over fp32 weights, the clipped token-mean loss, backward, AdamW), in one process, one after the other. It pushes
  no weights and scores nothing, so rlplan's weight sync, reward and controller count as its overhead; the table's
  caption gives rlplan / limit per phase and for the step. `--sides rlplan,limit` runs without TRL installed.

Every side first runs `--warmup-steps` steps (default 1) that its figures leave out: a first step carries
one-time costs (rlplan's first weight sync and optimizer state, the allocators' growth, TRL's first generate),
and the limit always dropped one.

Printed per side: seconds per step (median over the timed steps), tokens per second per phase (median over the
steps; TRL's phases are its generation, the reward and advantages around it, and the rest of the step as its
actor update), and the mean reward of the first and of the last three steps. The machine may be shared: the
figures are as noisy as it is.
Needs trl==1.16.0 beside the runtime: `nox -s versus_trl` installs both, pinned by constraints/versus_trl.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
TRL_VERSION = "1.16.0"
SIDES = ("trl", "rlplan", "limit")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="RL steps per side, timed")
    parser.add_argument("--warmup-steps", type=int, default=1,
                        help="steps each side runs first and leaves out of its figures (first-step costs: the "
                             "first weight sync, optimizer state, allocator growth)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--response-len", type=int, default=128, help="new tokens per sample, at most")
    parser.add_argument("--lengths", choices=("fixed", "free"), default="fixed",
                        help="fixed: every response is --response-len tokens on both sides; free: stop at EOS")
    # At 5e-4 both sides collapse within two steps on this task; at 1e-5 both rise over four or five.
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--compute-dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="both sides' compute dtype; auto: what rlplan's solver picks for this CPU")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=2, help="rlplan's CPU trainer ranks")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--work-dir", default=None, help="where the model, data and runs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--output", default=None,
                        help="also write that JSON object to this file (nox mixes the children's logs into stdout)")
    parser.add_argument("--sides", default="trl,rlplan,limit",
                        help="which sides run, comma-separated, of trl, rlplan and limit (raw vLLM + raw torch)")
    parser.add_argument("--side", choices=("both", *SIDES), default="both", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    if not args.sides or set(args.sides) - set(SIDES):
        parser.error(f"--sides takes a comma-separated subset of {', '.join(SIDES)}")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    for name in ("steps", "prompts", "n", "response_len", "world_size", "layers", "hidden", "vocab"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.hidden % 64:
        parser.error("--hidden must be a multiple of 64 (64-wide heads)")
    return args


# --- the shared inputs ---------------------------------------------------------------------------


def prepare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The model and the task both sides read, built once."""
    from rlplan.runtime.tiny import build_tiny_model, toy_messages, toy_records, write_toy_dataset

    model_dir = work / "model"
    if not (model_dir / "config.json").exists():
        # Four KV heads for the 8 query heads of hidden 512; MLP 2.5x as wide as the hidden state, as the demo's.
        build_tiny_model(model_dir, seed=args.seed, num_layers=args.layers, vocab_size=args.vocab,
                         hidden_size=args.hidden, intermediate_size=args.hidden * 5 // 2,
                         num_kv_heads=max(1, args.hidden // 128))
    prompts = (args.warmup_steps + args.steps) * args.prompts
    parquet, jsonl = write_toy_dataset(work / "data" / "train.parquet", prompts, seed=args.seed)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    longest = max(len(_chat_ids(tokenizer, toy_messages(row["reward_model"]["ground_truth"])))
                  for row in toy_records(prompts, args.seed))
    return {"model_dir": str(model_dir), "parquet": str(parquet), "jsonl": str(jsonl), "max_prompt_length": longest}


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


# --- TRL -----------------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace, inputs: dict[str, Any], out_dir: Path) -> list[dict[str, float]]:
    """TRL's GRPOTrainer on the task; one record per step."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlplan.runtime.tiny import toy_score

    rows = [json.loads(line) for line in Path(inputs["jsonl"]).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]}
                                 for row in rows])

    def toy_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        return [toy_score(c[0]["content"] if isinstance(c, list) else c, truth)
                for c, truth in zip(completions, ground_truth, strict=True)]

    steps: list[dict[str, float]] = []
    current: dict[str, float] = {}

    class TimedGRPOTrainer(GRPOTrainer):
        """Times generation and the whole generate-and-score pass; counts the tokens they handle."""

        def _generate(self, prompts: list) -> Any:
            started = time.perf_counter()
            result = super()._generate(prompts)
            prompt_ids, completion_ids = result[0], result[1]
            current["rollout_s"] = current.get("rollout_s", 0.0) + time.perf_counter() - started
            current["rollout_tokens"] = current.get("rollout_tokens", 0) + sum(len(ids) for ids in completion_ids)
            current["update_tokens"] = current.get("update_tokens", 0) + sum(
                len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True))
            return result

        def _generate_and_score_completions(self, *a: Any, **k: Any) -> Any:
            started = time.perf_counter()
            result = super()._generate_and_score_completions(*a, **k)
            current["generate_and_score_s"] = current.get("generate_and_score_s", 0.0) + time.perf_counter() - started
            return result

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            current.clear()
            current["started"] = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            record = dict(current)
            record["step_s"] = time.perf_counter() - record.pop("started")
            steps.append(record)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict[str, float] | None = None, **__: Any) -> None:
            if logs and "reward" in logs and steps:
                steps[-1]["reward"] = float(logs["reward"])
                steps[-1]["entropy"] = logs.get("entropy")
                steps[-1]["response_length"] = logs.get("completions/mean_length")

    config = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=args.prompts * args.n,  # completions per step
        num_generations=args.n,
        steps_per_generation=1,
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_completion_length=args.response_len,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        loss_type="dapo",  # token-mean over the batch, verl's default loss_agg_mode
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.warmup_steps + args.steps,
        seed=args.seed,
        data_seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=args.compute_dtype == "bfloat16",
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
        generation_kwargs={"min_new_tokens": args.response_len} if args.lengths == "fixed" else None,
    )
    trainer = TimedGRPOTrainer(model=inputs["model_dir"], reward_funcs=[toy_reward], args=config,
                               train_dataset=dataset, callbacks=[StepClock()])
    trainer.train()
    records = []
    for step in steps[args.warmup_steps:]:
        rollout_s = step.get("rollout_s", 0.0)
        scoring_s = max(0.0, step.get("generate_and_score_s", 0.0) - rollout_s)
        update_s = max(1e-9, step["step_s"] - step.get("generate_and_score_s", 0.0))
        records.append({
            "step_s": step["step_s"],
            "reward": step.get("reward", float("nan")),
            "entropy": step.get("entropy"),
            "response_length": step.get("response_length"),
            # rlplan's phase names where the work is the same: TRL's update forward also yields the
            # log-probs (on-policy), so it has no separate old-log-prob pass.
            "phase_s": {"rollout": rollout_s, "reward_and_advantages": scoring_s, "actor_update": update_s},
            "tokens_per_s": {"rollout": step.get("rollout_tokens", 0) / max(rollout_s, 1e-9),
                             "actor_update": step.get("update_tokens", 0) / update_s},
        })
    return records


# --- rlplan --------------------------------------------------------------------------------------


def rlplan_plan(args: argparse.Namespace, inputs: dict[str, Any], out_dir: Path) -> Any:
    """The plan `rlplan demo` solves for this workload, with the benchmark's batch, lengths, lr and seed."""
    import attrs

    from rlplan.runtime.demo_workload import demo_plan, solve_demo_plan

    workload = demo_plan(inputs["model_dir"], inputs["parquet"], out_dir, steps=args.warmup_steps + args.steps,
                         algorithm="grpo_full",
                         world_size=args.world_size, train_batch_size=args.prompts, n=args.n, lr=args.lr,
                         seed=args.seed)
    workload = workload.evolve(
        data=attrs.evolve(workload.data, max_prompt_length=inputs["max_prompt_length"],
                          max_response_length=args.response_len),
        # One optimizer step per RL step, no KL term, the same clip range as TRL's.
        actor=attrs.evolve(workload.actor, ppo_mini_batch_size=args.prompts, use_kl_loss=False,
                           clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH),
        rollout=attrs.evolve(workload.rollout, max_model_len=None, ignore_eos=args.lengths == "fixed"),
    )
    return solve_demo_plan(workload, pins={"actor.compute_dtype": args.compute_dtype})


def run_rlplan(args: argparse.Namespace, inputs: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    from rlplan.planner.planfile import plan_to_toml

    plan = rlplan_plan(args, inputs, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_file = out_dir / "plan.toml"
    plan_file.write_text(plan_to_toml(plan))
    rlplan = Path(sys.executable).with_name("rlplan")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    completed = subprocess.run([str(rlplan), "run", str(plan_file), "--output-dir", str(out_dir)], env=env,
                               stdout=sys.stderr, stderr=sys.stderr, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"rlplan run exited {completed.returncode}")
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    records = []
    for row in rows[args.warmup_steps:]:
        phases = {name: row[f"time/{name}"] for name in ("rollout", "old_log_prob", "ref_log_prob", "actor_update",
                                                            "weight_sync") if f"time/{name}" in row}
        rates = {key.split("/")[1].removesuffix("_tokens_per_s"): value for key, value in row.items()
                 if key.startswith("throughput/") and value is not None}
        records.append({"step_s": row["time/step"], "reward": row["reward_mean"], "entropy": row.get("entropy"),
                        "response_length": row.get("response_length_mean"), "phase_s": phases,
                        "tokens_per_s": rates})
    return records


# --- the synchronous limit: raw vLLM + raw torch --------------------------------------------------


def _raw_engine(model_dir: str, dtype: str, seed: int, kv_space_gib: float) -> Any:
    """vLLM's `LLM` with nothing but the model, its dtype and seed, on every core (as rlplan's rollout actor and
    TRL's process get them): vLLM's own scheduler and batching defaults. On a CPU three settings are the machine's,
    not tuning, and are rlplan's engine's too: the engine core in this process (the trainer shares it), OpenMP
    threads left unpinned (pinned, they collide with the trainer's), and the same KV space."""
    import torch

    from rlplan.runtime.workers import use_every_core

    if not torch.cuda.is_available():
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_space_gib)
        use_every_core()
    import vllm

    return vllm.LLM(model=model_dir, dtype=dtype, seed=seed)


def _raw_update_step(model: Any, optimizer: Any, sequences: list[tuple[list[int], list[int]]], dtype: str) -> int:
    """One raw torch GRPO update over the whole batch: a padded forward (autocast in bf16, fp32 weights as TRL's
    and rlplan's trainers keep them), the log-probs of the response tokens, the clipped surrogate at ratio 1
    (on-policy, one optimizer step per RL step), token-mean, backward, grad clip 1.0, AdamW. Returns the tokens."""
    import torch

    longest = max(len(p) + len(r) for p, r in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response = torch.zeros(len(sequences), longest, dtype=torch.bool)
    for row, (prompt, reply) in enumerate(sequences):
        tokens = prompt + reply
        ids[row, : len(tokens)] = torch.tensor(tokens)
        attention[row, : len(tokens)] = 1
        response[row, len(prompt) : len(tokens)] = True
    advantages = torch.randn(len(sequences), 1)  # the cost does not depend on the values
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = response[:, 1:]
    ratio = torch.exp(log_probs - log_probs.detach())
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH) * advantages)
    loss = -(surrogate * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return int(attention.sum())


def run_limit(args: argparse.Namespace, inputs: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """The step's synchronous limit: raw vLLM `LLM.generate` of the same batch (prompts x n, the same lengths,
    temperature 1), then one raw torch update of it (`_raw_update_step`), on every core, in one process. No weight
    push, no reward, no controller: whatever rlplan's step spends beyond these two is its own overhead."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlplan.runtime.tiny import toy_messages

    rows = [json.loads(line) for line in Path(inputs["jsonl"]).read_text().splitlines() if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(inputs["model_dir"])
    prompts = [_chat_ids(tokenizer, toy_messages(row["reward_model"]["ground_truth"])) for row in rows]
    from rlplan.planner.memory.rollout import vllm_cpu_kv_space_gib

    kv_space = vllm_cpu_kv_space_gib(rlplan_plan(args, inputs, out_dir))
    engine = _raw_engine(inputs["model_dir"], args.compute_dtype, args.seed, kv_space)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(inputs["model_dir"], dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    import vllm

    params = vllm.SamplingParams(n=args.n, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=args.response_len,
                                 ignore_eos=args.lengths == "fixed", seed=args.seed)
    records = []
    for step in range(args.warmup_steps + args.steps):  # the warm-up steps are left out, as on every side
        batch = prompts[step * args.prompts : (step + 1) * args.prompts]
        started = time.perf_counter()
        outputs = engine.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        generated = time.perf_counter()
        sequences = [(list(output.prompt_token_ids), list(sample.token_ids))
                     for output in outputs for sample in output.outputs]
        update_tokens = _raw_update_step(model, optimizer, sequences, args.compute_dtype)
        done = time.perf_counter()
        if step < args.warmup_steps:
            continue
        rollout_s, update_s = generated - started, done - generated
        records.append({"step_s": done - started, "reward": float("nan"), "entropy": None,
                        "response_length": statistics.fmean(len(r) for _, r in sequences),
                        "phase_s": {"rollout": rollout_s, "actor_update": update_s},
                        "tokens_per_s": {"rollout": sum(len(r) for _, r in sequences) / rollout_s,
                                         "actor_update": update_tokens / update_s}})
    return records


def limit_ratios(sides: dict[str, Any]) -> dict[str, float]:
    """rlplan's median seconds over the limit's, per phase the limit has and for the step."""
    ours, limit = sides["rlplan"], sides["limit"]
    ratios = {f"{phase} s": ours["phase_seconds_median"][phase] / seconds
              for phase, seconds in limit["phase_seconds_median"].items() if phase in ours["phase_seconds_median"]}
    ratios["step s"] = ours["seconds_per_step_median"] / limit["seconds_per_step_median"]
    return ratios


# --- the comparison ------------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    phases = sorted({name for r in records for name in r["tokens_per_s"]})
    rewards = [r["reward"] for r in records]
    return {
        "steps": len(records),
        "seconds_per_step_median": statistics.median(r["step_s"] for r in records),
        "phase_seconds_median": {name: statistics.median(r["phase_s"][name] for r in records if name in r["phase_s"])
                                 for name in sorted({n for r in records for n in r["phase_s"]})},
        "tokens_per_s_median": {name: statistics.median(r["tokens_per_s"][name] for r in records
                                                        if name in r["tokens_per_s"]) for name in phases},
        "reward_first3": statistics.fmean(rewards[:3]),  # nan for the limit, which scores nothing
        "reward_last3": statistics.fmean(rewards[-3:]),
        "per_step": records,
    }


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    sides = result["sides"]
    names = {"trl": f"TRL {TRL_VERSION} GRPOTrainer", "rlplan": "rlplan run",
             "limit": "the synchronous limit (raw vLLM generate + raw torch update)"}
    table = Table(title=f"GRPO, {result['workload']}: " + ", ".join(names[side] for side in sides))
    table.add_column("")
    for name in sides:
        table.add_column(name, justify="right")
    table.add_row("seconds per step (median)", *(f"{s['seconds_per_step_median']:.2f}" for s in sides.values()))
    phases = sorted({p for s in sides.values() for p in s["tokens_per_s_median"]})
    for phase in phases:
        table.add_row(f"{phase} tokens/s", *(f"{s['tokens_per_s_median'][phase]:.0f}"
                                             if phase in s["tokens_per_s_median"] else "-" for s in sides.values()))
    for phase in sorted({p for s in sides.values() for p in s["phase_seconds_median"]}):
        table.add_row(f"{phase} s", *(f"{s['phase_seconds_median'][phase]:.2f}"
                                      if phase in s["phase_seconds_median"] else "-" for s in sides.values()))
    for label, key in (("reward, first 3 steps", "reward_first3"), ("reward, last 3 steps", "reward_last3")):
        table.add_row(label, *("-" if math.isnan(s[key]) else f"{s[key]:.3f}" for s in sides.values()))
    captions = []
    if "trl" in sides and "rlplan" in sides:
        trl, ours = sides["trl"], sides["rlplan"]
        captions.append(f"rlplan / TRL step time: {ours['seconds_per_step_median'] / trl['seconds_per_step_median']:.2f}x")
    if "limit" in sides and "rlplan" in sides:
        captions.append("rlplan / limit: " + ", ".join(f"{name} {ratio:.2f}x"
                                                        for name, ratio in result["rlplan_over_limit"].items()))
    captions.append(f"one side after the other on {os.cpu_count()} cores")
    table.caption = "; ".join(captions)
    Console(highlight=False).print(table)


def _child(args: argparse.Namespace, side: str, work: Path) -> dict[str, Any]:
    """Run one side in a fresh interpreter, so neither inherits the other's threads, memory or imports."""
    argv = [sys.executable, __file__, "--side", side, "--work-dir", str(work), "--json",
            "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps), "--prompts", str(args.prompts), "--n", str(args.n),
            "--response-len", str(args.response_len), "--lengths", args.lengths, "--lr", str(args.lr), "--seed", str(args.seed),
            "--compute-dtype", args.compute_dtype, "--sides", ",".join(args.sides),
            "--world-size", str(args.world_size), "--layers", str(args.layers), "--hidden", str(args.hidden),
            "--vocab", str(args.vocab)]
    completed = subprocess.run(argv, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"the {side} side exited {completed.returncode}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compute_dtype == "auto":
        from rlplan.planner.commands.this_machine import this_machine_compute_dtype

        args.compute_dtype = this_machine_compute_dtype()
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="rlplan-versus-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.side != "both":
        inputs = json.loads((work / "inputs.json").read_text())
        runner = {"trl": run_trl, "rlplan": run_rlplan, "limit": run_limit}[args.side]
        records = runner(args, inputs, work / f"run-{args.side}")
        print(json.dumps(summarize(records)))
        return 0
    inputs = prepare(args, work)
    (work / "inputs.json").write_text(json.dumps(inputs))
    sides = {side: _child(args, side, work) for side in SIDES if side in args.sides}
    result: dict[str, Any] = {
        "workload": f"{args.layers}-layer Qwen2 h{args.hidden} V{args.vocab}, {args.prompts} prompts x {args.n} "
                    f"samples x {'' if args.lengths == 'fixed' else '<= '}{args.response_len} tokens, lr {args.lr:g}, seed {args.seed}, "
                    f"{args.steps} steps timed after {args.warmup_steps} warm-up, rlplan on {args.world_size} rank(s), both computing in {args.compute_dtype}",
        "sides": sides,
    }
    if "limit" in sides and "rlplan" in sides:
        result["rlplan_over_limit"] = limit_ratios(sides)
    if args.output:
        from rlplan.planner.commands.commands_io import write_atomic

        write_atomic(args.output, json.dumps(result, indent=2) + "\n", "--output")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
