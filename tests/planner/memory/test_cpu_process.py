"""The CPU runtime's per-process terms: a per-machine baseline (measured or the built-in bound) and a heap that
scales with the model (planner/memory/cpu_process.py)."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.commands.this_machine import cpu_cluster
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.cpu_process import cpu_baselines, model_copy_bytes
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.profile import DEFAULT_PROFILE
from tests.planner.plans import make_plan

MEASURED = attrs.evolve(DEFAULT_PROFILE, cpu_trainer_baseline_measured_gib=0.5, cpu_rollout_baseline_measured_gib=0.8)


def _on_cpu(plan):
    cluster, _ = cpu_cluster(2, 16.0)
    return plan.evolve(cluster=cluster)


def _component(report, phase, name):
    return next(c.bytes for c in report.phase(phase).components if c.name == name)


def test_a_measured_baseline_replaces_the_built_in_bound_in_every_phase_and_the_plan_says_which():
    plan = _on_cpu(make_plan())
    built_in, measured = predict_memory(plan), predict_memory(plan, MEASURED)
    for phase in ("actor_update", "weight_sync"):
        assert _component(built_in, phase, "cpu_process_baseline") == int(DEFAULT_PROFILE.cpu_trainer_process_gib * GIB)
        assert _component(measured, phase, "cpu_process_baseline") == int(0.5 * GIB)
    assert _component(measured, "rollout", "vllm_cpu_process_baseline") == int(0.8 * GIB)
    assert any("built-in bound" in note and "assumption" in note for note in built_in.notes)
    assert any("measured on this machine" in note for note in measured.notes)
    assert not any("baseline" in note for note in predict_memory(make_plan()).notes)  # a GPU plan has none


def test_only_both_measured_baselines_count_as_measured():
    half = attrs.evolve(DEFAULT_PROFILE, cpu_trainer_baseline_measured_gib=0.5)
    assert not cpu_baselines(half).measured and cpu_baselines(MEASURED).measured


@pytest.mark.parametrize("copies", [0.0, 4.0, 8.5])
def test_the_trainer_heap_adds_its_copies_of_the_model_to_every_trainer_phase(copies):
    plan = _on_cpu(make_plan())
    none = predict_memory(plan, attrs.evolve(MEASURED, cpu_trainer_heap_model_copies=0.0))
    some = predict_memory(plan, attrs.evolve(MEASURED, cpu_trainer_heap_model_copies=copies))
    for phase in ("old_log_prob", "actor_update", "weight_sync"):
        added = _component(some, phase, "cpu_heap_high_water") - _component(none, phase, "cpu_heap_high_water")
        assert abs(added - copies * model_copy_bytes(plan)) <= 1
    assert "cpu_heap_high_water" not in {c.name for c in some.phase("rollout").components}


@pytest.mark.parametrize("fragmentation", [0.0, 0.3, 1.0])
def test_every_cpu_trainer_phase_holds_the_steps_high_water_mark_because_glibc_keeps_it(fragmentation):
    plan = _on_cpu(make_plan())
    report = predict_memory(plan, attrs.evolve(MEASURED, cpu_trainer_heap_fragmentation=fragmentation))
    trainer = [p.peak_bytes for p in report.phases if p.name != "rollout"]
    assert max(trainer) - min(trainer) <= 2
    bare = attrs.evolve(MEASURED, cpu_trainer_heap_fragmentation=0.0, cpu_trainer_heap_model_copies=0.0)
    high_water = max(p.peak_bytes for p in predict_memory(plan, bare).phases if p.name != "rollout")
    copies = MEASURED.cpu_trainer_heap_model_copies * model_copy_bytes(plan)
    priced = high_water - int(0.5 * GIB)  # the largest phase's bytes beside the baseline
    assert abs(max(trainer) - (high_water + copies + fragmentation * priced)) <= 2


def test_the_engine_holds_the_synced_copy_under_full_fine_tuning_and_none_when_only_an_adapter_travels():
    full = _on_cpu(make_plan())
    lora = _on_cpu(make_plan(overrides={"model.lora.rank": 8}))
    payload = full.rollout.dtype_bytes * model_facts(full.model.arch).params
    received = _component(predict_memory(full, MEASURED), "rollout", "cpu_engine_received_weights")
    assert received == int(MEASURED.cpu_engine_sync_model_copies * payload) > 0
    assert _component(predict_memory(lora, MEASURED), "rollout", "cpu_engine_received_weights") == 0
    host = next(c.bytes for c in predict_memory(full, MEASURED).host.components if c.name == "vllm_cpu_engine")
    assert host >= received + int(0.8 * GIB)
