"""Rollout tokens/s through VllmRollout beside raw vLLM `LLM.generate`, same model, same batch.

The difference is rlplan's overhead around vLLM (building requests, reading log-probs into
GeneratedSample). Runs on the bundled tiny model, on CPU or GPU:

    .venv/bin/python benchmarks/rollout_throughput.py --prompts 64 --n 8 --max-tokens 32
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "rlplan-tiny")
    args = parser.parse_args()

    import attrs

    from rlplan.runtime import tiny
    from rlplan.runtime.rollout import VllmRollout

    model_dir = tiny.ensure_tiny_model(args.cache_dir)
    plan = tiny.tiny_plan(model_dir, max_response_length=args.max_tokens)
    # Every sample of the batch in flight at once, as in a rollout step.
    plan = plan.evolve(rollout=attrs.evolve(plan.rollout, max_num_seqs=args.prompts * args.n))
    prompts = _prompts(model_dir, args.prompts)

    rollout = VllmRollout(str(model_dir), plan, seed=0)
    import vllm

    params = vllm.SamplingParams(
        n=args.n,
        temperature=plan.rollout.temperature,
        top_p=plan.rollout.top_p,
        top_k=plan.rollout.top_k,
        max_tokens=args.max_tokens,
        logprobs=0,
    )
    requests = [{"prompt_token_ids": prompt} for prompt in prompts]

    def raw() -> int:
        # The very engine VllmRollout drives, called directly: the gap is rlplan's own work.
        outputs = rollout._llm.generate(requests, params, use_tqdm=False)
        return sum(len(completion.token_ids) for output in outputs for completion in output.outputs)

    def through_rlplan() -> int:
        return sum(len(s.response_ids) for s in rollout.generate(prompts, args.n, max_tokens=args.max_tokens))

    raw(), through_rlplan()  # warm-up
    # Alternate the two so that load from elsewhere on the machine hits both alike.
    raw_runs, rlplan_runs = [], []
    for _ in range(args.repeats):
        raw_runs.append(_tokens_per_second(raw))
        rlplan_runs.append(_tokens_per_second(through_rlplan))
    rollout.shutdown()
    raw_rate, raw_tokens = max(raw_runs)
    rlplan_rate, rlplan_tokens = max(rlplan_runs)

    print(
        f"batch: {args.prompts} prompts x n={args.n}, up to {args.max_tokens} tokens, best of {args.repeats}"
    )
    print(f"{'path':<28}{'tokens/call':>12}{'tokens/s':>12}")
    print(f"{'vllm LLM.generate (raw)':<28}{raw_tokens:>12}{raw_rate:>12.0f}")
    print(f"{'rlplan VllmRollout.generate':<28}{rlplan_tokens:>12}{rlplan_rate:>12.0f}")
    print(f"rlplan overhead: {100 * (raw_rate - rlplan_rate) / raw_rate:+.1f}% of raw throughput")


if __name__ == "__main__":
    main()
