"""Rollout tokens/s through VllmRollout beside raw vLLM `LLM.generate`, same model, same batch.

    .venv/bin/python benchmarks/rollout_throughput.py --prompts 64 --n 8 --max-tokens 32
    .venv/bin/python benchmarks/rollout_throughput.py --plan run/plan.toml [--repeats 3]

Three rows, one model and one batch of the toy task's prompts:
- `vllm LLM.generate, plan's engine`: the very engine VllmRollout drives, called directly with the same
  sampling parameters; the gap to the next row is rlplan's own work (building requests, reading log-probs).
- `rlplan VllmRollout.generate`: what a rollout step calls.
- `vllm LLM.generate, vLLM defaults`: a second engine built afterwards with nothing but the model, its dtype
  and seed (vLLM's own scheduler and batching defaults, the same KV space on a CPU), so the engine settings
  the plan chose are judged against vLLM's out of the box.
The first two alternate repeat after repeat; each row reports its best repeat.

Without --plan, the bundled tiny model with the tiny plan's engine settings and every sample in flight at
once. With --plan (say the plan.toml `rlplan demo` or `benchmarks/versus_trl.py` writes, the solver's
choices), the plan's model, engine knobs (max_num_seqs, max_num_batched_tokens, dtype, ignore_eos, ...),
batch (train_batch_size prompts x rollout.n) and max_response_length; the flags then override the batch.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def _prompts(model_dir: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from rlplan.runtime import tiny
    from rlplan.runtime.data import tokenize_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenize_prompt(tokenizer, record["prompt"]) for record in tiny.toy_records(count, seed=0)]


def _tokens_per_second(run) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = run()
    return tokens / (time.perf_counter() - start), tokens


def _plan_and_batch(args: argparse.Namespace):
    import attrs

    from rlplan.runtime import tiny

    if args.plan is None:
        model_dir = tiny.ensure_tiny_model(args.cache_dir)
        prompts, n, max_tokens = args.prompts or 64, args.n or 8, args.max_tokens or 32
        plan = tiny.tiny_plan(model_dir, max_response_length=max_tokens)
        # Every sample of the batch in flight at once, as in a rollout step.
        plan = plan.evolve(rollout=attrs.evolve(plan.rollout, max_num_seqs=prompts * n))
        return plan, Path(model_dir), prompts, n, max_tokens
    from rlplan.planner.commands.commands_io import load_plan

    plan = load_plan(args.plan)
    if plan.model.path is None:
        raise SystemExit(f"{args.plan}: model.path is not set; the benchmark needs the model's weights")
    return (plan, Path(plan.model.path), args.prompts or plan.data.train_batch_size, args.n or plan.rollout.n,
            args.max_tokens or plan.data.max_response_length)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plan", type=Path, default=None, help="take the model, engine knobs and batch from it")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per batch (64; with --plan its batch)")
    parser.add_argument("--n", type=int, default=None, help="samples per prompt (8; with --plan rollout.n)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="new tokens per sample, at most (32; with --plan max_response_length)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "rlplan-tiny")
    args = parser.parse_args()

    import torch

    from rlplan.runtime.rollout import VllmRollout
    from rlplan.runtime.workers import use_every_core

    plan, model_dir, prompt_count, n, max_tokens = _plan_and_batch(args)
    prompts = _prompts(model_dir, prompt_count)
    if not torch.cuda.is_available():
        # Every core, as the runtime's rollout actor takes them; the vLLM-defaults engine below gets them too.
        use_every_core()
    rollout = VllmRollout(str(model_dir), plan, seed=0)
    import vllm

    params = vllm.SamplingParams(
        n=n,
        temperature=plan.rollout.temperature,
        top_p=plan.rollout.top_p,
        top_k=plan.rollout.top_k,
        max_tokens=max_tokens,
        ignore_eos=plan.rollout.ignore_eos,
        logprobs=0,
    )
    requests = [{"prompt_token_ids": prompt} for prompt in prompts]

    def raw(llm) -> int:
        outputs = llm.generate(requests, params, use_tqdm=False)
        return sum(len(completion.token_ids) for output in outputs for completion in output.outputs)

    def through_rlplan() -> int:
        return sum(len(s.response_ids) for s in rollout.generate(prompts, n, max_tokens=max_tokens))

    # The engine starts from dummy weights where the plan says so; give it the model's own.
    if rollout.needs_full_weights:
        from safetensors.torch import load_file

        rollout.sync_full_weights(load_file(str(model_dir / "model.safetensors")).items())
    engine = rollout._llm
    raw(engine), through_rlplan()  # warm-up
    # Alternate the two so that load from elsewhere on the machine hits both alike.
    raw_runs, rlplan_runs = [], []
    for _ in range(args.repeats):
        raw_runs.append(_tokens_per_second(lambda: raw(engine)))
        rlplan_runs.append(_tokens_per_second(through_rlplan))
    rollout.shutdown()

    defaults = vllm.LLM(model=str(model_dir), dtype=plan.rollout.dtype, seed=0)
    raw(defaults)  # warm-up
    default_runs = [_tokens_per_second(lambda: raw(defaults)) for _ in range(args.repeats)]
    defaults.llm_engine.engine_core.shutdown()

    on_plan, ours, on_defaults = max(raw_runs), max(rlplan_runs), max(default_runs)
    rows = {"vllm LLM.generate, plan's engine": on_plan, "rlplan VllmRollout.generate": ours,
            "vllm LLM.generate, vLLM defaults": on_defaults}
    ignore = ", ignore_eos" if plan.rollout.ignore_eos else ""
    print(f"model {model_dir}, {plan.rollout.dtype}; batch: {prompt_count} prompts x n={n}, up to {max_tokens} "
          f"tokens{ignore}; engine: max_num_seqs {plan.rollout.max_num_seqs}, max_num_batched_tokens "
          f"{plan.rollout.max_num_batched_tokens}; best of {args.repeats}")
    print(f"{'path':<36}{'tokens/call':>12}{'tokens/s':>12}")
    for label, (rate, tokens) in rows.items():
        print(f"{label:<36}{tokens:>12}{rate:>12.0f}")
    print(f"rlplan / raw on the plan's engine: {ours[0] / on_plan[0]:.2f}x; "
          f"rlplan / vLLM defaults: {ours[0] / on_defaults[0]:.2f}x")

if __name__ == "__main__":
    main()
