"""The explain tables (planner/report.py)."""

from __future__ import annotations

import attrs
from rich.console import Console

from rlplan.planner.plan import MegatronSection
from rlplan.planner.report import knobs_table
from tests.planner.plans import make_plan


def _rows(plan) -> dict[str, str]:
    """knobs_table's rows as plain text, keyed by their first column."""
    console = Console(record=True, width=400)
    console.print(knobs_table(plan))
    rows = {}
    for line in console.export_text().splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_a_megatron_plan_shows_megatrons_own_offload_recompute_and_parallel_sizes():
    key = "+actor_rollout_ref.actor.optim.override_optimizer_config."
    plan = make_plan(overrides={"actor.strategy": "megatron"})
    engine = MegatronSection(param_offload=True, optimizer_offload=True, expert_model_parallel_size=8,
                             recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2)
    plan = plan.evolve(actor=attrs.evolve(plan.actor, megatron=engine),
                       passthrough={key + "optimizer_cpu_offload": "True", key + "optimizer_offload_fraction": "0.5"})
    rows = _rows(plan)
    assert rows["offload"] == "params True, grads unset, optimizer True (CPU optimizer 50%); ref params True"
    assert rows["activations"].startswith("recompute full, uniform, 2 layer(s)")
    assert rows["parallel"].startswith("TP 1, PP 1, CP 1, EP 8, ETP 1")
    assert "checkpointing" not in rows["activations"] and "Ulysses" not in rows["parallel"]


def test_a_megatron_plan_without_recompute_says_so_and_an_fsdp_plan_keeps_its_own_rows():
    assert _rows(make_plan(overrides={"actor.strategy": "megatron"}))["activations"].startswith("recompute off")
    fsdp = _rows(make_plan(overrides={"model.gradient_checkpointing": True}))
    assert fsdp["activations"].startswith("checkpointing True")
    assert fsdp["parallel"].startswith("Ulysses 1")


def _layout_title(plan) -> str:
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.report import layout_table

    console = Console(record=True, width=400)
    console.print(layout_table(plan_layout(plan), megatron=plan.is_megatron))
    return console.export_text().splitlines()[0]


def test_a_megatron_layout_names_its_model_parallel_span_and_context_parallel_size_not_fsdps():
    plan = make_plan(gpus=8, overrides={"actor.strategy": "megatron"})
    plan = plan.evolve(actor=attrs.evolve(plan.actor, megatron=MegatronSection(
        tensor_model_parallel_size=2, pipeline_model_parallel_size=2, context_parallel_size=2)))
    title = _layout_title(plan)
    assert "dp 1, TP x PP 4, CP 2" in title and "FSDP" not in title and "Ulysses" not in title
    assert "Ulysses 1, FSDP shard 8" in _layout_title(make_plan(gpus=8))
