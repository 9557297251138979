"""The host-side costs of a verl step, measured on this CPU side by side (the sources of profile.dataproto_gbps
and profile.rollout_host_seconds_per_sequence; docs/steptime.md, "A step's fixed costs").

    python benchmarks/host_costs.py

Each cost is rebuilt from what verl's code does on the host, at the sizes of the public play-verl logs
(benchmarks/data/steptime_logs.toml), with torch on this machine's CPU:

* the DataProto transfer of a worker call: the batch chunked per rank, each chunk `torch.save`d into bytes and
  loaded back (verl/protocol.py DataProto.__getstate__ / __setstate__, v0.4.0), the results concatenated;
* the GAE advantage (core_algos.compute_gae_advantage_return: a backwards loop over the response positions,
  a few column ops each, then whitening), which the logs also time (`timing_s/adv`): its ratio here to there
  is this CPU's speed against the logs' host, and scales the other costs to that host;
* the rollout worker's pre- and post-processing per sequence (vllm_rollout_spmd.py: strip each prompt's left
  padding into a list, pad every response to the maximum).

Timings here are noisy (a shared machine); nothing asserts them. The profile's constants are the scaled
figures rounded, and the step-time fit (benchmarks/steptime_holdout.py) keeps them apart from the fitted ones.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable

import torch

# (label, sequences, max prompt, max response, the log's measured timing_s/adv in seconds)
LOG_SIZES = (("play-verl 7B PPO min", 512, 512, 1024, 0.044), ("play-verl 7B PPO recommended", 5120, 512, 1024, 0.232),
             ("play-verl 0.5B PPO", 2048, 512, 256, 0.0235))


def best_of(run: Callable[[], object], tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def padded_batch(sequences: int, prompt: int, response: int, floats: int) -> dict[str, torch.Tensor]:
    length = prompt + response
    batch = {"input_ids": torch.randint(0, 150_000, (sequences, length)),
             "attention_mask": torch.ones(sequences, length, dtype=torch.int64),
             "position_ids": torch.arange(length).repeat(sequences, 1),
             "prompts": torch.randint(0, 150_000, (sequences, prompt)),
             "responses": torch.randint(0, 150_000, (sequences, response)),
             "response_mask": torch.ones(sequences, response, dtype=torch.int64)}
    batch.update({f"float{i}": torch.randn(sequences, response) for i in range(floats)})
    return batch


def ship(batch: dict[str, torch.Tensor], ranks: int) -> dict[str, torch.Tensor]:
    """Out to `ranks` workers through bytes and back, concatenated: the DataProto round trip of one call."""
    received = []
    for rank in range(ranks):
        chunk = {key: value.chunk(ranks)[rank].contiguous() for key, value in batch.items()}
        buffer = io.BytesIO()
        torch.save(chunk, buffer)
        received.append(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    return {key: torch.cat([part[key] for part in received]) for key in batch}


def gae(sequences: int, response: int) -> torch.Tensor:
    values, rewards = torch.randn(sequences, response), torch.randn(sequences, response)
    mask = torch.ones(sequences, response)
    running = torch.zeros(sequences)
    reversed_advantages = []
    for position in reversed(range(response)):
        following = values[:, position + 1] if position < response - 1 else torch.zeros(sequences)
        running = rewards[:, position] + following - values[:, position] + 0.95 * running
        reversed_advantages.append(running)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    mean = (advantages * mask).sum() / mask.sum()
    variance = ((advantages - mean) ** 2 * mask).sum() / mask.sum()
    return (advantages - mean) * torch.rsqrt(variance + 1e-8)


def rollout_processing(sequences: int, prompt: int, response: int) -> torch.Tensor:
    prompts = torch.randint(1, 150_000, (sequences, prompt))
    prompts[:, : prompt // 2] = 0  # left padding
    unpadded = [row[torch.nonzero(row != 0)[0][0]:].tolist() for row in prompts]
    generated = [list(range(response // 4)) for _ in unpadded]
    padded = torch.zeros(sequences, response, dtype=torch.int64)
    for i, tokens in enumerate(generated):
        padded[i, : len(tokens)] = torch.tensor(tokens)
    return padded


def main() -> int:
    torch.set_num_threads(1)
    print("| run | batch MB | DataProto round trip here s (GB/s) | GAE here s | GAE on the log's host s | host "
          "factor | transfer scaled GB/s | rollout processing here us/seq | scaled us/seq |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, sequences, prompt, response, adv in LOG_SIZES:
        batch = padded_batch(sequences, prompt, response, floats=7)
        size = sum(t.numel() * t.element_size() for t in batch.values())
        shipped = best_of(lambda batch=batch: ship(batch, 8), tries=2)
        here = best_of(lambda s=sequences, r=response: gae(s, r))
        factor = here / adv
        per_sequence = best_of(lambda s=sequences, p=prompt, r=response: rollout_processing(s, p, r)) / sequences
        print(f"| {label} | {size / 1e6:.0f} | {shipped:.2f} ({size / shipped / 1e9:.2f}) | {here:.3f} | {adv:.3f} | "
              f"{factor:.1f} | {size / shipped / 1e9 * factor:.2f} | {per_sequence * 1e6:.0f} | "
              f"{per_sequence * 1e6 / factor:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
