"""How wrong the memory model is (planner/model_error.py): bands from the measured rows, the margin solve keeps."""

from __future__ import annotations

import functools

import attrs
import pytest

from rlplan.planner import model_error
from rlplan.planner.errors import PlanError
from rlplan.planner.memory.heads import resolved_loss_head
from rlplan.planner.model_error import (
    AccuracyRow,
    ErrorBand,
    Headroom,
    accuracy_rows,
    parse_headroom,
    peak_error_band,
    plan_margin,
    run_rows,
)
from rlplan.planner.phases import Phase
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.stack import StackSection
from tests.planner.plans import make_plan


def _errors(kind: str, head: str | None, strategy: str = "fsdp2") -> list[float]:
    return [row.error for row in accuracy_rows() if row.kind == kind and (head is None or row.head == head)
            and (kind == "engine" or row.strategy == strategy)]


def test_every_row_of_the_data_file_is_a_measurement_beside_a_prediction():
    rows = accuracy_rows()
    assert {"steps", "heads", "torchtitan", "llm-d"} <= {row.source for row in rows}
    for row in rows:
        assert row.measured_mib > 0 and row.predicted_mib > 0
        assert row.kind in ("update", "forward", "engine")


def test_a_phase_band_holds_its_twin_rows_and_every_real_runs_error():
    plan = make_plan()
    head = resolved_loss_head(plan)
    for phase, kind in ((Phase.ACTOR_UPDATE, "update"), (Phase.OLD_LOG_PROB, "forward")):
        errors = _errors(kind, head)
        band = peak_error_band(plan, phase)
        assert band.rows == len(errors) > 0 and head in band.basis
        real = [row.error for row in run_rows() if row.counter == "allocated"]
        assert band.runs == len(real) > 0
        for error in errors + real:
            assert -band.under <= error <= band.over
    # The critic's value head and the engine take every head's twin rows.
    engine = peak_error_band(plan, Phase.ROLLOUT)
    assert engine.rows == len(_errors("engine", None)) > 0


def test_the_real_runs_are_the_public_logs_each_against_the_others_fit():
    rows = run_rows()
    assert {row.counter for row in rows} == {"allocated", "reserved"}
    assert all(row.real_run and row.regime and row.kind in ("update", "forward", "engine") for row in rows)
    # Within 15 % out of sample, and the reserved counter never under-predicted by more than 10 % (issue 37).
    assert all(abs(row.error) <= 0.15 for row in rows)
    assert all(row.error > -0.10 for row in rows if row.counter == "reserved")


def test_a_band_is_never_narrower_than_the_real_runs_nor_of_zero_width():
    plan = make_plan()
    for counter in ("allocated", "reserved"):
        for phase in model_error.plan_phases(plan):
            band = peak_error_band(plan, phase, counter)
            assert band.under > 0 and band.over > 0
            for row in run_rows():
                if row.counter == counter:
                    assert -band.under <= row.error <= band.over


def test_without_comparable_rows_the_band_says_so():
    fsdp1 = make_plan(overrides={"actor.strategy": "fsdp"})
    band = peak_error_band(fsdp1, Phase.ACTOR_UPDATE)
    every = _errors("update", None) + [r.error for r in accuracy_rows() if r.kind == "update" and r.strategy != "fsdp2"]
    assert band.rows == 0 and "no measured" in band.basis
    assert band.under >= max(0.0, -min(every))
    # verl 0.9's regime (the engine in its own process, expandable segments) has no public run: said.
    assert not band.comparable_runs and "no comparable real run" in band.describe()
    old = make_plan(overrides={"actor.strategy": "fsdp"}).evolve(stack=StackSection(verl="0.3.0.post1"))
    assert peak_error_band(old, Phase.ACTOR_UPDATE, engine_in_process=True).comparable_runs


def test_the_band_follows_the_rows_not_constants(monkeypatch):
    plan = make_plan()
    head = resolved_loss_head(plan)
    fake = (AccuracyRow(source="heads", model="m", phase="actor_update", head=head, strategy="fsdp2",
                        configuration="c", measured_mib=100.0, predicted_mib=80.0),
            AccuracyRow(source="heads", model="m", phase="actor_update", head=head, strategy="fsdp2",
                        configuration="d", measured_mib=100.0, predicted_mib=104.0))
    monkeypatch.setattr(model_error, "accuracy_rows", lambda: fake)
    monkeypatch.setattr(model_error, "run_rows", lambda: ())
    caches = (model_error.error_band, model_error._twin_band, model_error.default_margin_fraction)
    for cache in caches:
        cache.cache_clear()
    try:
        band = peak_error_band(plan, Phase.ACTOR_UPDATE)
        assert (band.rows, band.under, band.over) == (2, pytest.approx(0.2), pytest.approx(0.04))
        assert band.describe() == "allocated: model error on comparable measured rows (no real run): -20 % to +4 %"
        # The default margin is the largest under-prediction once it passes the floor.
        assert plan_margin(plan).fraction == pytest.approx(0.2)
    finally:
        for cache in caches:
            cache.cache_clear()


def test_a_handful_of_real_runs_gives_a_prediction_interval_wider_than_what_they_showed():
    under, over = model_error.real_run_interval([-0.03, 0.05, 0.01, -0.01])
    assert under > 0.03 and over > 0.05
    assert model_error.real_run_interval([]) == (0.0, 0.0)
    # Never inside the errors seen, whatever their spread.
    assert model_error.real_run_interval([0.02, 0.02]) == (pytest.approx(0.0), pytest.approx(0.02))


def test_highest_actual_peak_undoes_the_largest_under_prediction():
    band = ErrorBand(under=0.2, over=0.0, rows=3, basis="three rows")
    assert band.highest_actual_gib(80.0) == pytest.approx(100.0)
    with pytest.raises(ValueError):
        ErrorBand(under=-0.1, over=0.0, rows=0, basis="")


def test_default_margin_is_the_floor_or_the_largest_under_prediction_of_the_plans_phases():
    plan = make_plan()
    margin = plan_margin(plan)
    # The margin keeps the largest under-prediction the rows showed (the band's edge is where a new run may fall).
    unders = [peak_error_band(plan, phase).seen_under for phase in model_error.plan_phases(plan)]
    expected = max(DEFAULT_PROFILE.headroom_floor_fraction, *unders)
    assert margin.default and margin.fraction == pytest.approx(expected)
    assert margin.bytes == int(expected * plan.cluster.gpu_memory_bytes)
    raised = plan_margin(plan, profile=attrs.evolve(DEFAULT_PROFILE, headroom_floor_fraction=0.3))
    assert raised.fraction == pytest.approx(0.3)


@pytest.mark.parametrize(("text", "fraction", "gib"), [
    ("10%", 0.1, None), ("4GiB", None, 4.0), ("4096MiB", None, 4.0), ("0", None, 0.0), ("0%", 0.0, None),
    (None, None, None), ("auto", None, None),
])
def test_headroom_takes_a_share_an_amount_or_zero(text, fraction, gib):
    headroom = parse_headroom(text)
    assert headroom.fraction == (pytest.approx(fraction) if fraction is not None else None)
    assert headroom.gib == (pytest.approx(gib) if gib is not None else None)


@pytest.mark.parametrize("text", ["-4GiB", "ten", "95%", "nan%", "4 apples", "inf"])
def test_a_bad_headroom_is_bad_input_naming_the_flag(text):
    with pytest.raises(PlanError) as error:
        parse_headroom(text)
    assert error.value.field == "--headroom"


def test_zero_headroom_keeps_no_margin_and_says_so():
    plan = make_plan()
    for headroom in (Headroom(gib=0.0), Headroom(fraction=0.0)):
        margin = plan_margin(plan, headroom)
        assert margin.bytes == 0 and "no margin" in margin.rule and not margin.default
    assert plan_margin(plan, Headroom(gib=4.0)).bytes == 4 * 2**30


def test_a_backend_no_measured_row_covers_gets_the_stated_assumption_not_another_backends_rows(monkeypatch):
    """A Megatron plan's update and forward bands are the Megatron twin's rows (any head: they run Megatron's own
    cross entropy, which the backend prices beside verl's head), never FSDP's; where no Megatron row measures a
    kind of pass (here with the twin's forward rows left out) it keeps the stated assumption rather than FSDP's
    rows of that kind."""
    from rlplan.planner.knobs import apply_knobs
    from tests.planner.test_verl_import_megatron import SCRIPTS, load

    megatron = load((SCRIPTS / "megatron_dense_qwen2_7b.sh").read_text(), {"HOME": "/home/u"}).plan
    assert megatron.actor.strategy == "megatron"
    assumed = DEFAULT_PROFILE.unmeasured_backend_under_fraction
    for phase, kind in ((Phase.ACTOR_UPDATE, "update"), (Phase.OLD_LOG_PROB, "forward")):
        rows = [row for row in accuracy_rows() if row.strategy == "megatron" and row.kind == kind]
        band = peak_error_band(megatron, phase)
        assert rows and not band.assumed and band.rows == len(rows), phase
        starts = [row.error for row in model_error.engine_start_rows()]
        assert band.under == pytest.approx(max(0.0, -min(row.error for row in rows), *(-e for e in starts)))
    kept = tuple(row for row in accuracy_rows() if not (row.strategy == "megatron" and row.kind == "forward"))
    monkeypatch.setattr(model_error, "accuracy_rows", lambda: kept)
    for cached in (model_error.error_band, model_error._twin_band, model_error.default_margin_fraction):
        monkeypatch.setattr(model_error, cached.__name__, functools.cache(cached.__wrapped__))
    forward = peak_error_band(megatron, Phase.OLD_LOG_PROB)
    assert forward.assumed and forward.rows == 0 and forward.under == pytest.approx(assumed)
    assert "unmeasured" in forward.describe()
    assert peak_error_band(megatron, Phase.ROLLOUT).assumed is False  # the engine's rows are the engine's
    assert plan_margin(megatron).fraction >= assumed
    # FSDP1 and FSDP2 are one backend: FSDP2's rows cover an FSDP1 plan.
    assert not peak_error_band(apply_knobs(make_plan(), {"actor.strategy": "fsdp"}), Phase.ACTOR_UPDATE).assumed


def test_a_megatron_plans_bands_say_what_public_evidence_of_real_runs_exists():
    """No public Megatron run with verl's phase counters was found: a Megatron plan's bands say so, with the count
    of sources examined (presets/megatron_public_evidence.toml) and of runs measured at the engine's start only;
    the reserved counter keeps the stated assumption, and an FSDP plan's bands (real runs) carry no such note."""
    from rlplan.planner.package_data import package_toml
    from tests.planner.test_verl_import_megatron import SCRIPTS, load

    megatron = load((SCRIPTS / "megatron_dense_qwen2_7b.sh").read_text(), {"HOME": "/home/u"}).plan
    sources = package_toml(model_error.MEGATRON_EVIDENCE_FILE)["source"]
    assert all(source["url"].startswith("https://") and source["why"] for source in sources)
    phase_peaks = sum(source["measures"] == "phase_peaks" for source in sources)
    starts = sum(source["measures"] == "engine_start" for source in sources)
    assert starts == len(model_error.engine_start_rows())
    note = (f"{phase_peaks} with phase memory counters, {starts} measured at the engine's start only "
            f"(docs/accuracy.md 4c), of {len(sources)} public sources examined")
    reserved = model_error.counter_error_band(megatron, Phase.ACTOR_UPDATE, "reserved",
                                              attrs.make_class("Scope", ["engine_in_process"])(True))
    assert reserved.assumed and reserved.under == pytest.approx(DEFAULT_PROFILE.unmeasured_backend_under_fraction)
    assert note in reserved.describe() and reserved.as_json()["evidence"] in reserved.as_json()["text"]
    assert note in peak_error_band(megatron, Phase.ACTOR_UPDATE).describe()
    assert not peak_error_band(make_plan(), Phase.ACTOR_UPDATE, "reserved").evidence


@pytest.mark.parametrize("kind", ["update", "forward", "engine"])
def test_a_megatron_allocated_band_is_never_narrower_than_the_runs_measured_at_the_engine_start(kind):
    errors = [row.error for row in model_error.engine_start_rows()]
    band = model_error.error_band(kind, None, "megatron", "allocated", model_error.allocator_regime(True, False))
    assert errors and band.under >= -min(errors) and band.over >= max(errors)
    assert band.seen_under >= -min(errors)


def test_the_engine_start_rows_are_what_the_benchmark_computes_and_within_five_percent():
    """presets/megatron_engine_start_rows.toml is benchmarks/megatron_public_runs.py's output on today's model
    (regenerate with --write-rows), and each public run's engine-start moment is priced within 5 % of its log."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import megatron_public_runs as bench

    starts = [bench.engine_start(run) for run in bench.RUNS]
    assert bench.engine_start_rows(starts) == list(model_error.engine_start_rows())
    for start in starts:
        assert abs(start.error) <= 0.05, (start.run.label, start.error)
