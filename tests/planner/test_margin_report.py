"""What solve, validate and explain say about the margin, the error band and host RAM (planner/margin_report.py)."""

from __future__ import annotations

import json

import pytest

from rlplan.planner.planfile import plan_from_toml
from tests.planner.cli_runner import invoke

SOLVE_7B = ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
            "--response-len", "2048"]
# Full fine-tuning of a 3B on one 24 GiB card: its training state goes to host RAM.
SOLVE_OFFLOAD = ["solve", "--model", "qwen2.5-3b", "--gpus", "1", "--gpu", "rtx4090", "--prompt-len", "512",
                 "--response-len", "512", "--train-batch-size", "8", "--n", "2", "--lora", "off"]


def _default_margin_gib() -> float:
    from rlplan.planner.model_error import plan_margin
    from tests.planner.plans import make_plan

    return plan_margin(make_plan()).fraction * 79.18


def payload_of(*args: str) -> dict:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_solve_json_carries_the_margin_what_the_plan_leaves_and_the_peaks_error_band():
    payload = payload_of(*SOLVE_7B)
    # The default margin: the largest under-prediction measured on the plan's phases' rows, real runs included
    # (planner/model_error.py), or the 5 % floor.
    assert payload["headroom_gib"] == pytest.approx(_default_margin_gib(), abs=0.01)
    assert payload["headroom"]["default"] and payload["headroom"]["left_gib"] >= payload["headroom_gib"]
    band = payload["error_band"]
    assert band["phase"] in payload["phases"] and band["rows"] > 0 and band["real_runs"] > 0
    assert band["text"].startswith("allocated: ") and " -" in band["text"]
    assert band["highest_actual_gib"] >= payload["gpu_peak_gib"]
    assert set(payload["phase_error_bands"]) == set(payload["phases"])


def test_solve_says_the_margin_in_one_line_and_explain_gives_its_details(tmp_path):
    """Issue 35 item 9: a five-line margin sentence ended every result. solve and validate say the peak, what it
    leaves free and the margin in one line; explain gives the error band and the margin's rule."""
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_7B, "-o", str(path))
    assert result.exit_code == 0, result.output
    margin = _default_margin_gib()
    payload = payload_of("validate", str(path))
    line = (f"peak {payload['gpu_peak_gib']:.2f} GiB in {payload['error_band']['phase']}: "
            f"{payload['headroom']['left_gib']:.2f} of 79.18 GiB free, margin {margin:.2f} GiB (default; `rlplan "
            "explain` says why)")
    assert len(line) <= 110
    for command in (result, invoke("validate", str(path))):
        said = " ".join(command.output.split())
        assert line in said and "model error on comparable" not in said and "(allocated: " not in said
    text = " ".join(invoke("explain", str(path)).output.split())
    assert "(allocated: " in text and f"margin {margin:.2f} GiB (default: {100 * margin / 79.18:.1f} %" in text


def test_headroom_flag_takes_a_share_an_amount_or_zero_and_says_zero():
    assert payload_of(*SOLVE_7B, "--headroom", "10%")["headroom_gib"] == pytest.approx(7.918, abs=0.001)
    assert payload_of(*SOLVE_7B, "--headroom", "4GiB")["headroom_gib"] == pytest.approx(4.0)
    zero = payload_of(*SOLVE_7B, "--headroom", "0")
    assert zero["headroom_gib"] == 0 and "no margin kept" in zero["headroom"]["rule"]
    result = invoke(*SOLVE_7B, "--headroom", "0")
    assert "--headroom 0: no margin kept" in " ".join(result.output.split())
    bad = invoke(*SOLVE_7B, "--headroom", "lots")
    assert bad.exit_code == 2 and "--headroom" in bad.output


def test_validate_warns_but_passes_a_plan_under_its_margin(tmp_path):
    path = tmp_path / "plan.toml"
    assert invoke(*SOLVE_7B, "--headroom", "0", "-o", str(path)).exit_code == 0
    result = invoke("validate", str(path), "--json", "--headroom", "20%")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["valid"] and payload["feasible"] and payload["headroom"]["below_margin"]
    assert [w["rule"] for w in payload["warnings"] if w["rule"] == "memory_margin"] == ["memory_margin"]
    text = invoke("validate", str(path), "--headroom", "20%")
    assert text.exit_code == 0 and "memory_margin" in text.output
    kept = payload_of("validate", str(path), "--headroom", "0")
    assert not kept["headroom"]["below_margin"] and all(w["rule"] != "memory_margin" for w in kept["warnings"])


def test_explain_prints_the_band_and_the_margin(tmp_path):
    path = tmp_path / "plan.toml"
    assert invoke(*SOLVE_7B, "-o", str(path)).exit_code == 0
    text = " ".join(invoke("explain", str(path)).output.split())
    assert "allocated: " in text and "real verl runs" in text and f"margin {_default_margin_gib():.2f} GiB" in text
    assert "headroom_gib" in payload_of("explain", str(path))


def test_solve_says_which_host_ram_it_assumed_and_takes_units_as_gpu_mem_does(tmp_path):
    assumed = payload_of(*SOLVE_7B)
    assert "2048 GiB" in assumed["host_memory_assumed"] and "H100" in assumed["host_memory_assumed"]
    assert assumed["host"]["capacity_gib"] == 2048
    given = payload_of(*SOLVE_7B, "--host-mem", "512GiB")
    assert given["host_memory_assumed"] is None and given["host"]["capacity_gib"] == 512
    assert payload_of(*SOLVE_7B, "--host-mem", "550GB")["host"]["capacity_gib"] == pytest.approx(512.227, abs=0.01)
    desktop = payload_of("solve", "--model", "qwen2.5-1.5b", "--gpus", "1", "--gpu", "rtx4090", *SOLVE_7B[7:])
    assert desktop["host"]["capacity_gib"] == 64 and "desktop" in desktop["host_memory_assumed"]


def test_an_offload_plan_names_the_host_ram_assumption_to_check(tmp_path):
    path = tmp_path / "plan.toml"
    result = invoke(*SOLVE_OFFLOAD, "-o", str(path))
    assert result.exit_code == 0, result.output
    plan = plan_from_toml(path.read_text())
    assert plan.actor.offload_policy or plan.actor.optimizer_offload
    text = " ".join(result.output.split())
    assert "offloads" in text and "64 GiB of host RAM per node assumed" in text and "--host-mem 512GiB" in text


def test_solve_top_shows_what_each_candidate_leaves_and_the_margin():
    payload = payload_of(*SOLVE_7B, "--top", "3")
    for row in payload["top"]:
        assert row["left_gib"] >= row["headroom_gib"] == payload["headroom_gib"]
    text = " ".join(invoke(*SOLVE_7B, "--top", "3").output.split())
    assert "free GiB" in text and f"leaves at least the {_default_margin_gib():.2f} GiB margin" in text


def test_an_infeasible_solve_lists_more_gpus_of_the_same_kind():
    result = invoke("solve", "--model", "llama-3.1-70b", "--gpus", "8", "--gpu", "a100-40g", "--lora", "off",
                    "--prompt-len", "1024", "--response-len", "2048", "--json")
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output)
    more = [s for s in payload["suggestions"] if s["more_gpus"]]
    assert [s["gpus"] for s in more] == [16] and more[0]["change"].startswith("--gpus 16")
    assert "1152 GiB" in payload["host_memory_assumed"]


def test_import_verl_assumes_the_gpus_typical_host_ram_and_says_so(tmp_path):
    script = tmp_path / "overrides.txt"
    script.write_text("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\ntrainer.n_gpus_per_node=8\n")
    assumed = payload_of("import", "verl", str(script), "--gpu", "h100")
    assert any("2048 GiB of host RAM per node assumed" in w for w in assumed["warnings"])
    assert plan_from_toml(assumed["plan_toml"]).cluster.host_memory_gib == 2048
    given = payload_of("import", "verl", str(script), "--gpu", "h100", "--host-mem", "512GiB")
    assert plan_from_toml(given["plan_toml"]).cluster.host_memory_gib == 512
    assert not any("assumed" in w for w in given["warnings"])
