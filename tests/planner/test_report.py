"""planner/report.py: the verdict, the margin line and the violations table are functions of the typed reports
(`PlanReports`), and the --json payload is written from the same values, so the lines and the JSON agree; the
explain tables show a plan's own backend knobs."""

from __future__ import annotations

import io
import re
import sys
import types

import attrs
import pytest
from rich.console import Console

from rlplan.planner.commands.solve_commands import verify_candidates
from rlplan.planner.margin_report import MarginWarning, margin_text
from rlplan.planner.memory import predict_memory
from rlplan.planner.model_error import Headroom
from rlplan.planner.phases import Phase
from rlplan.planner.plan import MegatronSection
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.report import (
    VerifiedCandidate,
    knobs_table,
    plan_reports,
    reports_json,
    validation_tables,
    verdict,
    violations_table,
)
from rlplan.planner.solver import Candidate
from rlplan.planner.steptime import predict_step_time
from tests.planner.plans import make_plan

GIB = 2**30


def rendered(renderable) -> str:
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_a_plan_that_fits_shows_the_peak_host_and_step_the_json_writes():
    reports = plan_reports(make_plan(), DEFAULT_PROFILE)
    payload = reports_json(reports)
    assert payload["valid"] and payload["feasible"]
    assert verdict(reports).plain.startswith(
        f"VALID and fits: peak {payload['gpu_peak_gib']:.2f} of {payload['gpu_mem_gib']:.2f} GiB per GPU, host "
        f"{payload['host']['per_node_gib']:.1f} of {payload['host']['capacity_gib']:.0f} GiB per node; step "
        f"~{payload['step_time_s']:.1f} s.")
    band, headroom = payload["error_band"], payload["headroom"]
    assert margin_text(reports.margin) == (
        f"peak {payload['gpu_peak_gib']:.2f} GiB in {band['phase']} ({band['text']}), at most "
        f"{band['highest_actual_gib']:.2f} GiB at the band's edge; leaves {headroom['left_gib']:.2f} "
        f"GiB of {payload['gpu_mem_gib']:.2f}, margin {headroom['gib']:.2f} GiB ({headroom['rule']}).")


def test_a_plan_over_the_gpu_names_the_binding_limit_of_the_json_and_the_lengths_that_fit():
    # Fixed micro batches of 16 sequences on 40 GiB: over at the maximum length, fits at short means.
    plan = make_plan(gpu_mem_gib=40.0, overrides={"actor.ppo_micro_batch_size_per_gpu": 16,
                                                  "actor.ppo_mini_batch_size": 64, "actor.entropy_coeff": 0.001})
    reports = plan_reports(plan, DEFAULT_PROFILE)
    payload = reports_json(reports)
    assert payload["valid"] and not payload["feasible"]
    binding, longest = payload["binding"], payload["longest_expected_response_that_fits"]
    assert 0 < longest < payload["max_response_length"]
    assert verdict(reports).plain == (
        f"VALID but predicted NOT to fit: {binding['where']} ({binding['resource']}) is over by "
        f"{-binding['free_gib']:.2f} GiB, mostly {binding['component']}. It fits while responses average <= "
        f"{longest} tokens (at {payload['expected_prompt_length']}-token prompts); OOM once they reach "
        f"{payload['max_response_length']}.")


def test_a_plan_over_even_at_one_token_responses_says_the_largest_mean_prompt_plus_response_that_fits():
    """The prompt is still at its maximum when every response length is over: the verdict shrinks both."""
    plan = make_plan(gpu_mem_gib=40.0, overrides={
        "data.max_prompt_length": 16384, "data.max_response_length": 4096, "rollout.max_model_len": 20480,
        "actor.ppo_micro_batch_size_per_gpu": 8, "rollout.log_prob_micro_batch_size_per_gpu": 8})
    reports = plan_reports(plan, DEFAULT_PROFILE)
    payload = reports_json(reports)
    assert payload["longest_expected_response_that_fits"] == 0
    fitting = payload["longest_expected_sequence_that_fits"]
    prompt, response = fitting["prompt"], fitting["response"]
    assert 0 < prompt < 16384 and 0 < response < 4096
    assert f"prompt + response average <= {prompt + response} tokens" in verdict(reports).plain
    assert "any response length" not in verdict(reports).plain

    def fits(p: int, r: int) -> bool:
        data = attrs.evolve(plan.data, expected_prompt_length=p, expected_response_length=r)
        return predict_memory(plan.evolve(data=data), DEFAULT_PROFILE).fits

    # The boundary: it fits there, and not once both grow by a few percent.
    assert fits(prompt, response) and not fits(int(prompt * 1.05) + 1, int(response * 1.05) + 1)
    # A plan that fits at one-token responses keeps the response-only answer and no sequence answer.
    assert reports_json(plan_reports(make_plan(), DEFAULT_PROFILE))["longest_expected_sequence_that_fits"] is None


def test_an_invalid_plan_counts_and_tabulates_the_violations_the_json_lists():
    # Both the per-GPU and the deprecated global micro batch: verl rejects the plan.
    reports = plan_reports(make_plan(overrides={"actor.ppo_micro_batch_size": 8}), DEFAULT_PROFILE)
    payload = reports_json(reports)
    assert not payload["valid"] and payload["errors"]
    assert verdict(reports).plain == (f"INVALID: {len(payload['errors'])} rule violation(s); verl would reject this "
                                      "plan.")
    table = violations_table(reports.rules.errors, reports.warnings)
    assert table.row_count == len(payload["errors"]) + len(payload["warnings"])
    text = rendered(table)
    assert all(item["rule"] in text for item in payload["errors"] + payload["warnings"])


def test_a_plan_under_its_margin_warns_in_the_json_and_in_the_table_alike():
    # A 90 % margin: any plan that fits leaves less than that.
    reports = plan_reports(make_plan(), DEFAULT_PROFILE, Headroom(fraction=0.9))
    payload = reports_json(reports)
    assert payload["feasible"] and payload["headroom"]["below_margin"]
    warning = reports.warnings[-1]
    assert isinstance(warning, MarginWarning)
    assert payload["warnings"][-1] == warning.as_json() == {"rule": "memory_margin", "message": warning.message,
                                                            "fix": warning.fix}
    tables = " ".join(rendered(table) for table in validation_tables(reports))
    assert "memory_margin" in tables and reports.margin.peak_phase in tables


def test_verify_keeps_the_first_candidate_whose_measured_step_fits_and_writes_each_row(monkeypatch):
    """Invariant: a candidate fits when its phase's peak with the measured step in place of the predicted one is
    within the GPU; the search stops at the first that does, best first."""
    plans = [make_plan(gpu_mem_gib=gib) for gib in (80.0, 81.0, 82.0)]
    candidates = []
    for plan in plans:
        memory = predict_memory(plan, DEFAULT_PROFILE)
        candidates.append(Candidate(plan=plan, memory=memory, step_time=predict_step_time(plan, memory,
                                                                                          DEFAULT_PROFILE)))
    measured_over = [100 * GIB, 0]  # the first measures 100 GiB above its prediction, the second as predicted

    def measure_plan(plan, phase, profile, head):
        assert phase is Phase.ACTOR_UPDATE and head == "auto"
        predicted = 10 * GIB
        return types.SimpleNamespace(planner_phase=Phase.ACTOR_UPDATE, predicted_bytes=predicted,
                                     measured=types.SimpleNamespace(peak_bytes=predicted + measured_over.pop(0)),
                                     error=0.0)

    monkeypatch.setitem(sys.modules, "rlplan.runtime.measure", types.SimpleNamespace(measure_plan=measure_plan))
    chosen, rows = verify_candidates(candidates, DEFAULT_PROFILE, None)
    assert chosen is plans[1]
    assert [(row.rank, row.fits) for row in rows] == [(1, False), (2, True)]
    update_peak = candidates[0].memory.phase(Phase.ACTOR_UPDATE).peak_bytes
    assert rows[0].measured_phase_peak_gib == pytest.approx((update_peak + 100 * GIB) / GIB, abs=1e-3)
    assert list(rows[0].to_json()) == ["rank", "predicted_step_gib", "measured_step_gib", "error",
                                       "measured_phase_peak_gib", "fits"]
    assert isinstance(rows[0], VerifiedCandidate)


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
    plan = make_plan(overrides={"actor.strategy": "megatron"})
    engine = MegatronSection(param_offload=True, optimizer_offload=True, expert_model_parallel_size=8,
                             recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2,
                             optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    plan = plan.evolve(actor=attrs.evolve(plan.actor, megatron=engine))
    rows = _rows(plan)
    assert rows["offload"] == "params on, grads unset, optimizer on (CPU optimizer 50%); ref params on"
    assert rows["activations"].startswith("recompute full, uniform, 2 layer(s)")
    assert rows["parallel"].startswith("TP 1, PP 1, CP 1, EP 8, ETP 1")
    assert "checkpointing" not in rows["activations"] and "Ulysses" not in rows["parallel"]


def test_a_megatron_plan_without_recompute_says_so_and_an_fsdp_plan_keeps_its_own_rows():
    assert _rows(make_plan(overrides={"actor.strategy": "megatron"}))["activations"].startswith("recompute off")
    fsdp = _rows(make_plan(overrides={"model.gradient_checkpointing": True}))
    assert fsdp["activations"].startswith("checkpointing on")
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


@pytest.mark.parametrize("overrides", [
    {},
    {"actor.use_dynamic_bsz": True, "actor.ppo_max_token_len_per_gpu": 8192,
     "rollout.log_prob_use_dynamic_bsz": True, "rollout.log_prob_max_token_len_per_gpu": 16384,
     "ref.log_prob_use_dynamic_bsz": True, "ref.log_prob_max_token_len_per_gpu": 16384},
    {"actor.strategy": "megatron"},
])
def test_explain_says_switches_as_on_or_off_and_names_the_micro_batches_the_plan_runs(overrides):
    """Issue 35 item 9: the Plan table said "offload params False" (Python's booleans in prose), and explain said
    "fixed micro batches" of a dynamic-batch plan."""
    from rlplan.planner.report import explain_tables

    plan = make_plan(overrides=overrides)
    text = "\n".join(rendered(table) for table in explain_tables(plan_reports(plan, DEFAULT_PROFILE)))
    assert not re.search(r"\b(True|False)\b", text), [line for line in text.splitlines() if "True" in line
                                                       or "False" in line]
    dynamic = plan.actor.use_dynamic_bsz
    assert ("fixed micro batches" in text) == (not dynamic)
    assert ("filled to their token budgets" in text) == dynamic


def test_a_split_plans_report_names_each_phases_pool_and_leaves_the_trainers_counters_off_the_rollout_gpu():
    from rlplan.planner.plan import RolloutPool

    plan = make_plan(overrides={"rollout.free_cache_engine": False})
    colocated = reports_json(plan_reports(plan, DEFAULT_PROFILE))
    assert not any("pool" in phase for phase in colocated["phases"].values())
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=4)))
    reports = plan_reports(apart, DEFAULT_PROFILE)
    phases = reports_json(reports)["phases"]
    assert phases["rollout"]["pool"] == "rollout" and "allocated_gib" not in phases["rollout"]
    assert phases["actor_update"]["pool"] == "trainer" and "allocated_gib" in phases["actor_update"]
    text = "\n".join(rendered(table) for table in validation_tables(reports))
    assert "rollout (rollout GPUs)" in text and "actor_update (trainer GPUs)" in text
