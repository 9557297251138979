"""Megatron-Core's own training step measured on the CPU (runtime/megatron_twin.py) against the memory model
(planner/memory/megatron.py), term by term and moment by moment.

    python benchmarks/megatron_twin.py                            # the table, from the cached measurements
    python benchmarks/megatron_twin.py --measure                  # re-measure every case (needs megatron-core;
                                                                  #   ~3-6 min a case on 2 cores), then the table
    python benchmarks/megatron_twin.py --measure --only moe-tp2-ep4
    python benchmarks/megatron_twin.py --write docs/accuracy.md   # its section 6b, and the Megatron rows of
                                                                  #   presets/measured_accuracy.toml

The measurements are cached in benchmarks/data/megatron_twin.json (what --measure writes), so the table and
the rows regenerate without megatron-core. Each case is a tiny Qwen-like model (hidden 256, 4 layers, vocab
4096: real tensors, one process per rank over gloo); the planner prices the same architecture and layout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from attrs import frozen

from rlplan.planner.memory.heads import FORWARD_HEAD_BYTES
from rlplan.planner.memory.megatron import (
    VERL_SAVES_DROPOUT_MASKS,
    cross_entropy_bytes,
    forward_pass_bytes,
    layer_activation_bytes_per_token,
    optimizer_step_bytes,
    stage_activations,
    state_on_most_loaded_rank,
)
from rlplan.runtime.megatron_twin import TwinCase, TwinModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import print_or_write_section  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "megatron_twin.json"
SECTION_HEADING = "## 6b. Megatron-Core's step measured on the CPU against the Megatron memory model"
MIB = 2**20
SOURCE = "megatron-twin"

DENSE = TwinModel()
MOE = TwinModel(experts=8, top_k=2, moe_ffn=256)
CASES = (
    TwinCase("dense-tp1", DENSE, world=1),
    TwinCase("dense-tp2", DENSE, world=2, tp=2),
    TwinCase("dense-tp2-pp2", DENSE, world=4, tp=2, pp=2, micro_batches=4),
    TwinCase("dense-tp2-full-recompute", DENSE, world=2, tp=2, recompute="full"),
    TwinCase("dense-dp2-no-distributed-optimizer", DENSE, world=2, distributed_optimizer=False),
    TwinCase("dense-tp2-offload", DENSE, world=2, tp=2, offload=True),
    TwinCase("moe-tp2-ep4", MOE, world=4, tp=2, ep=4),
    # then verl's no-grad log-prob pass: the old-log-prob's (the entropy beside the log-probs) or the reference's
    TwinCase("dense-tp1-old-log-prob", DENSE, world=1, log_prob="entropy"),
    TwinCase("dense-tp2-old-log-prob", DENSE, world=2, tp=2, log_prob="entropy"),
    TwinCase("dense-tp2-ref-log-prob", DENSE, world=2, tp=2, log_prob="log_probs"),
    TwinCase("moe-ep2-old-log-prob", MOE, world=2, ep=2, log_prob="entropy"),
)
# The head coefficient verl's defaults give a plan's no-grad passes (heads.FORWARD_HEAD_BYTES: flash-attn's cross
# entropy, the compiled entropy): all a Megatron log-prob pass was priced with before these measurements.
VERL_FORWARD_HEAD = {"entropy": FORWARD_HEAD_BYTES["flash_attn_ce"]["compiled"],
                     "log_probs": FORWARD_HEAD_BYTES["flash_attn_ce"]["none"]}


@frozen
class Moments:
    """One case's bytes per moment of the step on its most loaded rank: measured, and as the planner prices them."""

    case: TwinCase
    measured: dict[str, float]
    predicted: dict[str, float]
    before: dict[str, float]


def predicted_moments(case: TwinCase, *, before: bool = False) -> dict[str, float]:
    """The planner's terms for the case: the state, the update's two candidate peaks (at the loss head, at a
    layer's backward), the optimizer step, what verl's offload leaves on the GPU between phases, and verl's
    no-grad log-prob pass (the weights, and the larger of the layers' transients and the head).
    `before`: as the model priced them before these measurements (no rotary Q and K, Megatron-Core's estimate
    of the loss head, no optimizer-step temporaries, the log-prob pass's head at verl's FSDP head coefficient)."""
    arch, engine = case.model.architecture(), case.engine()
    state = state_on_most_loaded_rank(arch, engine, case.world)
    stages = stage_activations(arch, engine, tokens_per_micro_batch=case.seq, micro_batches=case.micro_batches,
                               dropout_masks=VERL_SAVES_DROPOUT_MASKS, rotary_outputs=not before)
    workspace = case.seq * layer_activation_bytes_per_token(
        arch, moe=arch.is_moe, tp=case.tp, etp=engine.expert_tensor_size, sequence_parallel=case.tp > 1,
        dropout_masks=VERL_SAVES_DROPOUT_MASKS, rotary_outputs=not before)
    head = stages.loss_head if before else cross_entropy_bytes(arch, tp=case.tp, tokens=case.seq)
    step = 0.0 if before else optimizer_step_bytes(state.largest_optimizer, foreach=case.foreach)
    moments = {
        "state": state.total,
        "loss": state.total + (stages.last_layers if before else stages.at_loss_head) + head,
        "backward": state.total + stages.layers_peak + workspace,
        "optimizer": state.total + step,
    }
    moments["update"] = max(moments["loss"], moments["backward"])
    if case.offload:
        moments["offloaded"] = 0.0
        moments["reload"] = state.total
    if case.log_prob:  # the twin runs verl >= 0.6's pass: the logits cloned where it computes the entropy
        layers, head = forward_pass_bytes(arch, tp=case.tp, tokens=case.seq,
                                          head_bytes_per_token_vocab=VERL_FORWARD_HEAD[case.log_prob],
                                          vocab_parallel_head=True, logits_cloned=case.log_prob == "entropy")
        if before:  # verl's head coefficient over the logits, and the output layer's input
            head = case.seq * (VERL_FORWARD_HEAD[case.log_prob] * arch.vocab_size / case.tp + 4 * arch.hidden_size)
        moments["log_prob"] = state.weights + max(layers, head)
    return moments


def measured_moments(ranks: list[dict[str, Any]], case: TwinCase) -> dict[str, float]:
    """The most loaded rank's bytes per moment (each moment's maximum over the ranks), net of the rank's fixed
    buffers: what the tracker holds before the step beyond the state's objects (Megatron's sequence-parallel
    all-gather buffer, tokens x hidden x 2 bytes, the rotary cache, the token ids, a pipeline stage's receive
    buffer): a few hundred KiB here, which a real model's GiB of state dwarf and the profile's overheads hold.
    `fixed` reports them."""
    fixed = {rank["rank"]: rank["state"] - sum(rank["parts"].values()) for rank in ranks}

    def most(key: str) -> float:
        return float(max(rank["peaks"].get(key, 0) - fixed[rank["rank"]] for rank in ranks))

    moments = {
        "fixed": float(max(fixed.values())),
        "state": float(max(sum(rank["parts"].values()) for rank in ranks)),
        "loss": max(most("forward"), most("loss"), most("loss_backward")),
        "backward": most("backward"),
        "optimizer": most("optimizer"),
    }
    moments["update"] = max(moments["loss"], moments["backward"])
    if case.offload:
        moments["offloaded"] = most("offloaded")
        moments["reload"] = most("reload")
    if case.log_prob:
        # The pass's peak with the weights alone of the state: the twin keeps the grads and the optimizer state on
        # the rank (verl offloads them between phases, or not: the phases' resident components say which).
        moments["log_prob"] = float(max(rank["peaks"]["log_prob"] - fixed[rank["rank"]] - sum(rank["parts"].values())
                                        + rank["parts"]["weights"] for rank in ranks))
    return moments


def load(path: Path = DATA) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"cases": {}}


def run_measurements(only: set[str] | None, path: Path = DATA) -> None:
    from rlplan.runtime.megatron_twin import measure

    data = load(path)
    for case in CASES:
        if only and case.label not in only:
            continue
        print(f"measuring {case.label} ({case.world} ranks) ...", flush=True)
        try:
            ranks = measure(case)
        except Exception as error:  # one case's failure (printed) leaves the others to measure
            print(f"{case.label} failed: {error}", flush=True)
            continue
        data["cases"][case.label] = {"case": case.as_json(), "ranks": ranks}
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def all_moments(data: dict[str, Any]) -> list[Moments]:
    rows = []
    for case in CASES:
        entry = data["cases"].get(case.label)
        if entry is None or TwinCase.from_json(entry["case"]) != case:
            continue  # not measured, or measured for another definition of the case
        rows.append(Moments(case, measured_moments(entry["ranks"], case), predicted_moments(case),
                            predicted_moments(case, before=True)))
    return rows


def _error(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.1f} %" if measured else "-"


def _layout(case: TwinCase) -> str:
    parts = [f"{case.world} ranks", f"TP {case.tp}"]
    parts += [f"{name} {size}" for name, size in (("PP", case.pp), ("EP", case.ep)) if size > 1]
    if case.recompute:
        parts.append(f"full recompute ({case.recompute_method}, {case.recompute_num_layers})")
    if not case.distributed_optimizer:
        parts.append("no distributed optimizer")
    if not case.foreach:
        parts.append("AdamW single-tensor loop")
    if case.offload:
        parts.append("verl offload")
    if case.log_prob:
        parts.append("then the " + _PASS[case.log_prob].split(" (")[0] + " pass")
    return ", ".join(parts)


_PASS = {"entropy": "old-log-prob (entropy, the logits cloned)", "log_probs": "reference (log-probs only)"}


def table(rows: list[Moments]) -> list[str]:
    moments = ("state", "loss", "backward", "update", "optimizer")
    lines = ["| case | layout | " + " | ".join(f"{moment}: measured / predicted MiB" for moment in moments)
             + " | update, optimizer before (error) | fixed buffers MiB |", "|---|---|" + "---|" * (len(moments) + 2)]
    for row in rows:
        cells = [f"{row.measured[m] / MIB:.1f} / {row.predicted[m] / MIB:.1f} ({_error(row.predicted[m], row.measured[m])})"
                 for m in moments]
        cells.append(", ".join(_error(row.before[m], row.measured[m]) for m in ("update", "optimizer")))
        cells.append(f"{row.measured['fixed'] / MIB:.2f}")
        lines.append(f"| {row.case.label} | {_layout(row.case)} | " + " | ".join(cells) + " |")
    log_prob = [row for row in rows if row.case.log_prob]
    if log_prob:
        lines += ["", "| case | pass | no-grad log-prob pass (the weights and the larger of the layers' transients "
                  "and the head): measured / predicted MiB | before these measurements |", "|---|---|---|---|"]
        lines += [f"| {row.case.label} | {_PASS[row.case.log_prob]} | {row.measured['log_prob'] / MIB:.1f} / "
                  f"{row.predicted['log_prob'] / MIB:.1f} ({_error(row.predicted['log_prob'], row.measured['log_prob'])})"
                  f" | {row.before['log_prob'] / MIB:.1f} ({_error(row.before['log_prob'], row.measured['log_prob'])}) |"
                  for row in log_prob]
    offload = [row for row in rows if row.case.offload]
    if offload:
        lines += ["", "| case | left on the GPU after verl's offload: measured / predicted MiB | reload peak |",
                  "|---|---|---|"]
        lines += [f"| {row.case.label} | {row.measured['offloaded'] / MIB:.1f} / {row.predicted['offloaded'] / MIB:.1f} "
                  f"| {row.measured['reload'] / MIB:.1f} / {row.predicted['reload'] / MIB:.1f} |" for row in offload]
    return lines


def data_rows(rows: list[Moments]) -> list[dict[str, Any]]:
    """presets/measured_accuracy.toml's Megatron rows: each case's update peak (planner/model_error.py reads
    them as the Megatron backend's update band)."""
    def row_of(row: Moments, phase: str, moment: str) -> dict[str, Any]:
        return {"source": SOURCE, "model": "twin-moe" if row.case.model.experts else "twin-dense", "phase": phase,
                "head": "megatron_ce", "strategy": "megatron", "configuration": _layout(row.case),
                "measured_mib": round(row.measured[moment] / MIB, 1),
                "predicted_mib": round(row.predicted[moment] / MIB, 1)}

    return ([row_of(row, "actor_update", "update") for row in rows]
            + [row_of(row, "old_log_prob" if row.case.log_prob == "entropy" else "ref_log_prob", "log_prob")
               for row in rows if row.case.log_prob])


def section(rows: list[Moments]) -> str:
    errors = [row.predicted["update"] / row.measured["update"] - 1 for row in rows]
    summary = (f"{len(rows)} cases; update peak error from {100 * min(errors):+.1f} % to {100 * max(errors):+.1f} %"
               if rows else "no case measured")
    passes = [row.predicted["log_prob"] / row.measured["log_prob"] - 1 for row in rows if row.case.log_prob]
    if passes:
        summary += (f"; the no-grad log-prob pass's peak from {100 * min(passes):+.1f} % to "
                    f"{100 * max(passes):+.1f} % ({len(passes)} cases)")
    return "\n".join([
        SECTION_HEADING, "",
        "Generated by `python benchmarks/megatron_twin.py --write docs/accuracy.md` from the measurements cached in "
        "benchmarks/data/megatron_twin.json (`--measure` re-runs them; megatron-core 0.16.1 from PyPI). "
        "Megatron-Core's own GPTModel, DDP grad buffer and optimizer (runtime/megatron_twin.py: its docstring "
        "says what is patched for the CPU and what the twin cannot cover) run one training step per rank over "
        "gloo, on a tiny Qwen-like model (hidden 256, 8 heads / 4 KV heads, SwiGLU 704, 4 layers, vocab 4096; "
        "the MoE: 8 experts of width 256, top-2, the all-to-all dispatcher), 1024-token micro batches, "
        "inside a tracker of live tensor bytes; the planner prices the same architecture and layout with the "
        "functions of planner/memory/megatron.py. Each moment is the most loaded rank's, net of its fixed "
        "buffers (the last column: Megatron's sequence-parallel all-gather buffer, the rotary cache, the token "
        "ids, a stage's receive buffer; kilobytes beside a real model's state, left to the profile's "
        "overheads): `state` before the step (bf16 weights, the fp32 grad buffer, fp32 main params and "
        "Adam's moments, summed from Megatron's own objects); `loss` the peak "
        "from the forward through the loss head's backward; `backward` the layers' backward; `update` the "
        "larger; `optimizer` the step; the last column the update's and the step's error as the model priced "
        "them before these measurements (no rotary Q and K, the loss head at Megatron-Core's estimate, no "
        "optimizer-step temporaries). The twin's loss head is Megatron's own vocabulary-parallel cross "
        "entropy (labels passed to GPTModel); verl's head is priced beside it (accuracy.md 1b). "
        "The log-prob cases then run verl's no-grad log-prob pass as verl 0.6-0.8's Megatron actor runs it "
        "without fused kernels (Megatron's forward-only schedule, GPTModel's bf16 logits, the in-place "
        "temperature, the logits' clone and verl's vocab_parallel_entropy where the pass computes the entropy, "
        "Megatron-Core's vocab_parallel_cross_entropy for the log-probs); their second table holds the pass's "
        "peak with the weights alone of the state (planner/memory/megatron.py forward_pass_bytes), and as the "
        "model priced it before (verl's FSDP head coefficient over the logits, with the output layer's input). "
        f"Error = predicted / measured - 1. {summary}.", "",
        *table(rows), "",
        "These rows are presets/measured_accuracy.toml's Megatron rows (source megatron-twin): a Megatron "
        "plan's error band is theirs (planner/model_error.py), no longer an assumption. What they cannot "
        "say: the CUDA caching allocator's rounding and fragmentation (the allocator replay's reserve, "
        "memory/allocator_trace.py), NCCL's buffers, Transformer Engine's own kernels (here stood in for by "
        "kernels that save what TE's save: flash attention's q, k, v, output and log-sum-exp, a fused RMSNorm's "
        "input and inverse RMS), grouped GEMM and context parallelism. Their band is the allocated counter's; no "
        "real Megatron run's counters were found, so the reserved counter's band of a Megatron plan is "
        f"{_reserved_band()}.",
    ]) + "\n"


def _reserved_band() -> str:
    """What planner/model_error.py gives a Megatron update's reserved counter, in its own words."""
    from rlplan.planner.model_error import error_band

    band = error_band("update", None, "megatron", "reserved")
    return f"-{100 * band.under:.1f} % / +{100 * band.over:.1f} % ({band.basis})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="re-measure the cases (needs megatron-core)")
    parser.add_argument("--only", action="append", default=None, help="with --measure: this case only")
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose section 6b to regenerate")
    args = parser.parse_args(argv)
    if args.measure:
        run_measurements(set(args.only) if args.only else None)
    rows = all_moments(load())
    if args.write is not None:
        from accuracy import kept_data_rows, write_data_rows

        write_data_rows([*kept_data_rows({SOURCE}), *data_rows(rows)])
    return print_or_write_section(section(rows), SECTION_HEADING, args.write)


if __name__ == "__main__":
    sys.exit(main())
