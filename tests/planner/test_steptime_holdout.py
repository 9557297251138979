"""benchmarks/steptime_holdout.py: the fit-and-hold-out protocol of the step-time model (docs/accuracy.md 5a)."""

from __future__ import annotations

import pytest

from rlplan.planner.profile import DEFAULT_PROFILE
from tests.repo_scripts import load_script


@pytest.fixture(scope="module")
def holdout():
    return load_script("benchmarks/steptime_holdout.py")


@pytest.fixture(scope="module")
def cases(holdout):
    return holdout.DATASETS["fsdp-sweeps"]() + holdout.DATASETS["public-logs"]()


def test_every_protocol_names_registered_datasets_and_profile_keys(holdout):
    for protocol in holdout.PROTOCOLS.values():
        assert protocol.datasets and set(protocol.datasets) <= set(holdout.DATASETS)
        assert protocol.keys and all(hasattr(DEFAULT_PROFILE, key) for key in protocol.keys)
        assert protocol.heading.startswith("## ")


def test_each_log_is_its_own_group_with_measured_phases_and_a_step(holdout, cases):
    logs = [case for case in cases if case.kind == "log"]
    assert len(logs) >= 4
    assert len({case.group for case in logs}) == len(logs)
    for case in logs:
        assert case.measured.get("step", 0) > 0, case.group
        assert any(key in case.measured for key in ("old_log_prob", "update_actor")), case.group


def test_a_held_out_group_is_never_priced_with_a_profile_fitted_on_it(holdout, cases, monkeypatch):
    fitted_on: list[set[str]] = []

    def recording_fit(fit_cases, keys, base, name, prior_weight=0.0):
        fitted_on.append({case.group for case in fit_cases})
        return base

    monkeypatch.setattr(holdout, "fitted_profile", recording_fit)
    priced = holdout.leave_one_group_out(cases, ("micro_batch_seconds_per_layer",))
    groups = holdout.groups(cases)
    assert len(fitted_on) == len(groups)
    for group, seen in zip(groups, fitted_on, strict=True):
        assert group not in seen and seen == set(groups) - {group}
    assert all(p.out_of_sample for p in priced) and len(priced) == len(cases)


def test_summary_counts_are_within_their_totals_and_ranks_are_per_sweep(holdout, cases):
    priced = holdout.price(cases, DEFAULT_PROFILE, out_of_sample=False)
    summary = holdout.summarize(priced)
    assert 0 <= summary.steps_within <= summary.steps == len(cases)
    assert 0 <= summary.phases_within <= summary.phases
    assert 0 <= summary.log_phases_within_factor <= summary.log_phases
    assert set(summary.ranks) == {case.group for case in cases if case.kind == "sweep"}
    assert all(-1.0 <= rho <= 1.0 for rho in summary.ranks.values())


def test_written_bands_replace_only_their_protocols_table_and_never_narrow_the_errors(holdout, cases, tmp_path):
    import tomllib

    priced = holdout.price(cases, DEFAULT_PROFILE, out_of_sample=True)
    path = tmp_path / "bands.toml"
    path.write_text('[other.gen]\nunder = 0.1\nover = 0.2\nruns = 3\n', encoding="utf-8")
    protocol = holdout.PROTOCOLS["fsdp"]
    holdout.write_bands(path, protocol, priced)
    tables = tomllib.loads(path.read_text(encoding="utf-8"))
    assert tables["other"] == {"gen": {"under": 0.1, "over": 0.2, "runs": 3}}
    for key, band in tables["fsdp"].items():
        errors = [e for p in priced if (e := p.error(key)) is not None]
        assert band["runs"] == len(errors)
        assert all(-band["under"] - 1e-4 <= e <= band["over"] + 1e-4 for e in errors), key


def test_megatron_runs_summed_over_rounds_keep_those_keys_out_and_the_section_says_so(holdout):
    cases = holdout.DATASETS["megatron-sweeps"]()
    summed = [case for case in cases if case.over_rounds]
    assert summed and all(not set(case.over_rounds) & set(case.measured) for case in summed)
    text = holdout._rounds_text(cases)
    assert text.startswith(" Not compared:") and f"of {len(summed)} runs" in text
    assert holdout._rounds_text([case for case in cases if not case.over_rounds]) == ""
