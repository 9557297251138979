"""The solver (planner/solver/): its plans validate, fit, and match brute force on small spaces."""

from __future__ import annotations

import itertools

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.memory import predict_memory
from rlplan.planner.plan import ModelSection
from rlplan.planner.presets import resolve_model
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.rules import check_plan
from rlplan.planner.solver import STEP_TIME_TOLERANCE, SolveRequest, gpu_limit_bytes, skeleton_plan, solve
from rlplan.planner.solver.fsdp import apply_training_choice, training_choices
from rlplan.planner.solver.rollout import tensor_parallel_options
from rlplan.planner.steptime import predict_step_time
from tests.planner.plans import without_inferred_range

MODELS = {name: resolve_model(name) for name in ("qwen2.5-0.5b", "qwen2.5-7b", "llama-3.1-8b", "qwen3-8b")}


def request_for(model: str, *, gpus: int, gpu_mem: float, prompt: int, response: int, batch: int, n: int,
                lora="auto", pins=None, algorithm: str = "grpo") -> SolveRequest:
    resolved = MODELS[model]
    per_node = min(gpus, 8)
    return SolveRequest(
        model=ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch),
        cluster=Cluster(gpu=GpuSpec(name="test", memory_gib=gpu_mem), nodes=gpus // per_node, gpus_per_node=per_node),
        prompt_len=prompt, response_len=response, train_batch_size=batch, n=n, lora=lora, pins=pins or {},
        algorithm=algorithm,
    )


@st.composite
def requests(draw):
    gpus = draw(st.sampled_from([1, 2, 4, 8, 16]))
    n = draw(st.sampled_from([2, 4, 5, 8]))
    # Whole sequences per GPU, so the request is divisible on this cluster and on twice as many GPUs.
    batch = 2 * gpus * draw(st.integers(1, 16))
    return request_for(
        draw(st.sampled_from(sorted(MODELS))),
        gpus=gpus,
        gpu_mem=draw(st.sampled_from([24.0, 40.0, 80.0, 141.0])),
        prompt=draw(st.sampled_from([256, 512, 1024, 2048])),
        response=draw(st.sampled_from([256, 1024, 2048, 4096, 8192])),
        batch=batch,
        n=n,
        lora=draw(st.sampled_from(["auto", "off", 32])),
        algorithm=draw(st.sampled_from(["grpo", "gae"])),
    )


def solved_plan(request):
    """The solved plan, or None where nothing fits, in which case the solver must say why."""
    result = solve(request)
    if result.best is None:
        assert result.diagnosis is not None and result.diagnosis.message
        return None
    return result.plan


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_solver_plans_always_validate_and_fit(request):
    plan = solved_plan(request)
    if plan is None:
        return
    assert check_plan(plan).valid, [v.message for v in check_plan(plan).errors]
    report = predict_memory(plan, request.profile)
    assert report.fits and report.rollout.holds_max_model_len
    assert report.rollout.starts  # the default stack's vLLM refuses to start below util x GPU free
    assert plan.rollout.max_model_len is not None
    assert plan.prediction is not None


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_more_gpus_or_more_memory_never_turn_a_feasible_request_infeasible(request):
    if solve(request).best is None:
        return
    more_gpus = attrs.evolve(request, cluster=attrs.evolve(
        request.cluster, nodes=request.cluster.nodes * 2) if request.cluster.world_size >= 8 else attrs.evolve(
        request.cluster, gpus_per_node=request.cluster.gpus_per_node * 2))
    more_memory = attrs.evolve(request, cluster=attrs.evolve(
        request.cluster, gpu=attrs.evolve(request.cluster.gpu, memory_gib=request.cluster.gpu.memory_gib * 1.5)))
    assert solve(more_gpus).best is not None
    assert solve(more_memory).best is not None


def brute_force(request: SolveRequest):
    """Every discrete choice x TP x token budget x utilization on a grid; the fastest feasible plan."""
    skeleton = skeleton_plan(request, request.response_len)
    sequence = skeleton.data.max_sequence_length
    best = None
    budgets = range(sequence, 8 * sequence + 1, 256)
    for choice in training_choices(request, sequence):
        if not (choice.gradient_checkpointing and not choice.activation_offload and not choice.ref_param_offload):
            continue  # the pins of the small space below
        base = apply_training_choice(skeleton, choice, request)
        for tp, actor_budget, log_prob_budget, util in itertools.product(
            tensor_parallel_options(request.model.arch, request.cluster), budgets, budgets,
            [u / 100 for u in range(10, 91, 5)],
        ):
            plan = base.evolve(
                actor=attrs.evolve(base.actor, ppo_max_token_len_per_gpu=actor_budget),
                rollout=attrs.evolve(base.rollout, tensor_model_parallel_size=tp, gpu_memory_utilization=util,
                                     log_prob_max_token_len_per_gpu=log_prob_budget,
                                     max_num_seqs=request.train_batch_size * request.n),
            )
            report = predict_memory(plan, request.profile)
            # The plans the solver may write: within the GPU less the margin it keeps.
            within = report.gpu_peak_bytes <= gpu_limit_bytes(plan, request)
            if not (report.fits and within and report.rollout.holds_max_model_len and check_plan(plan).valid):
                continue
            seconds = predict_step_time(plan, report, request.profile).total_seconds
            if best is None or seconds < best:
                best = seconds
    return best


@pytest.mark.parametrize("gpu_mem", [7.0, 8.0, 9.0, 24.0])
def test_solver_finds_the_brute_force_optimum_on_a_small_space(gpu_mem):
    pins = {"model.gradient_checkpointing": True, "model.activation_offload": False, "ref.param_offload": False}
    request = request_for("qwen2.5-0.5b", gpus=2, gpu_mem=gpu_mem, prompt=128, response=128, batch=8, n=2,
                          lora="off", pins=pins)
    result = solve(request)
    optimum = brute_force(request)
    if optimum is None:
        assert result.best is None
        return
    assert result.best is not None
    # The solver takes each budget and the utilization as large as fits, on finer grids than the brute force; among
    # candidates within its step-time tolerance of the fastest it takes the one leaving the most memory.
    assert result.best.step_time.total_seconds <= optimum * (1 + STEP_TIME_TOLERANCE) * (1 + 1e-9)


def test_infeasible_request_names_the_binding_constraint_and_a_change_that_fits():
    # With FSDP2's CPU offload policy the whole training state would move to host RAM; without it, nothing fits.
    request = request_for("qwen2.5-7b", gpus=1, gpu_mem=24.0, prompt=1024, response=8192, batch=8, n=4, lora="off",
                          pins={"actor.offload_policy": False})
    result = solve(request)
    assert result.best is None
    diagnosis = result.diagnosis
    assert diagnosis.binding
    assert diagnosis.suggestions, diagnosis.message
    change = diagnosis.suggestions[0].change
    assert change.split()[0] in {"--gpus", "--gpu", "--response-len", "--train-batch-size", "--lora"}


def test_max_response_len_finds_the_longest_response_that_fits():
    request = attrs.evolve(
        request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=1024, batch=64, n=4),
        response_len=None, max_response_len=32768 - 1024,
    )
    result = solve(request)
    assert result.best is not None
    longest = result.plan.data.max_response_length
    assert longest % 256 == 0 or longest == 32768 - 1024
    if longest + 256 + 1024 <= MODELS["qwen2.5-7b"].arch.max_position_embeddings:
        assert solve(attrs.evolve(request, response_len=longest + 256, max_response_len=None)).best is None


@pytest.mark.parametrize("option", ["response_len", "max_response_len"])
def test_a_length_past_the_context_is_refused_with_the_room_left_not_cut_silently(option):
    base = request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=1024, batch=64, n=4)
    with pytest.raises(PlanError) as error:
        attrs.evolve(base, **{"response_len": None, option: 100000})
    assert error.value.field == "--" + option.replace("_", "-")
    assert "32768" in error.value.message and "31744" in error.value.fix and "1M" in error.value.fix


def test_lora_auto_prefers_full_fine_tuning_when_it_fits():
    result = solve(request_for("qwen2.5-0.5b", gpus=8, gpu_mem=80.0, prompt=512, response=512, batch=64, n=4))
    assert result.plan.model.lora.rank == 0


@pytest.mark.parametrize(("verl", "level"), [("0.5.0", 1), ("0.6.1", 2)])
def test_a_full_fine_tuning_plan_sleeps_at_the_level_its_verl_release_picks(verl, level):
    result = solve(request_for("qwen2.5-0.5b", gpus=8, gpu_mem=80.0, prompt=512, response=512, batch=64, n=4,
                               pins={"stack.verl": verl}))
    assert result.plan is not None and result.plan.model.lora.rank == 0
    assert result.plan.rollout.sleep_level == level


def test_lora_auto_falls_back_to_a_rank_of_at_least_32():
    # Full fine-tuning would fit with its whole state in host RAM (CPU offload policy); without it, LoRA.
    result = solve(request_for("qwen2.5-7b", gpus=1, gpu_mem=80.0, prompt=512, response=1024, batch=16, n=4,
                               pins={"actor.offload_policy": False}))
    assert result.best is not None
    assert result.plan.model.lora.rank >= 32
    assert result.plan.rollout.sleep_level == 1
    assert result.plan.rollout.load_format == "safetensors"


def test_bad_request_is_a_plan_error():
    with pytest.raises(PlanError) as caught:
        request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=-1, batch=8, n=4)
    assert caught.value.field == "--response-len"


def test_pinning_fixed_micro_batches_solves_the_largest_micro_batch_that_divides_and_fits():
    pins = {"actor.use_dynamic_bsz": False, "rollout.log_prob_use_dynamic_bsz": False}
    result = solve(request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=2048, batch=256, n=5,
                               pins=pins))
    plan = result.plan
    assert plan is not None and check_plan(plan).valid
    assert not plan.actor.use_dynamic_bsz
    mini_per_gpu = plan.actor.ppo_mini_batch_size * plan.rollout.n // plan.cluster.world_size
    micro = plan.actor.ppo_micro_batch_size_per_gpu
    assert micro is not None and mini_per_gpu % micro == 0
    # The next larger divisor of the mini batch would not fit the update phase.
    from rlplan.planner.memory import predict_phase

    larger = [d for d in range(micro + 1, mini_per_gpu + 1) if mini_per_gpu % d == 0]
    if larger:
        bigger = plan.evolve(actor=attrs.evolve(plan.actor, ppo_micro_batch_size_per_gpu=larger[0]))
        assert predict_phase(bigger, "actor_update").peak_bytes > plan.cluster.gpu_memory_bytes


def test_pinned_rollout_utilization_sizes_max_num_seqs_from_the_kv_cache_it_leaves():
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.steptime import workload_lengths

    pins = {"rollout.gpu_memory_utilization": 0.3}
    plan = solve(request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=2048, batch=1024, n=5,
                             pins=pins)).plan
    assert plan is not None and plan.rollout.gpu_memory_utilization == 0.3
    report = predict_memory(plan, DEFAULT_PROFILE)
    # Sized for what the pinned 0.3 holds at the expected lengths (a running sequence holds its prompt and
    # what it generated so far), not for the ~0.8 the solver would pick, nor for the whole batch.
    lengths = workload_lengths(plan)
    held = report.rollout.usable_kv_cache_tokens / (lengths.prompt_mean + lengths.running_response)
    per_replica = 1024 * 5 / plan_layout(plan).parallel.rollout_replicas
    assert plan.rollout.max_num_seqs <= held < per_replica
    unpinned = solve(request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=2048, batch=1024,
                                 n=5)).plan
    assert unpinned is not None and unpinned.rollout.max_num_seqs > plan.rollout.max_num_seqs


def test_pinned_max_num_seqs_derives_max_num_batched_tokens_and_is_kept():
    pins = {"rollout.max_num_seqs": 9000}
    plan = solve(request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=2048, batch=256, n=5,
                             pins=pins)).plan
    assert plan is not None and plan.rollout.max_num_seqs == 9000
    assert plan.rollout.max_num_batched_tokens >= 9000


def test_pinned_token_budget_is_an_input_to_its_pass():
    pins = {"actor.ppo_max_token_len_per_gpu": 4096}
    plan = solve(request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=2048, batch=256, n=5,
                             pins=pins)).plan
    assert plan is not None and plan.actor.ppo_max_token_len_per_gpu == 4096
    assert predict_memory(plan, DEFAULT_PROFILE).fits


@pytest.mark.parametrize(("changes", "rule", "fixed"), [
    ({"train_batch_size": 100, "n": 3}, "dispatch_divisible_by_dp", [{"train_batch_size": 96}, {"train_batch_size": 104}]),
    ({"train_batch_size": 1, "n": 5}, "actor_micro_batch_divides_mini", [{"train_batch_size": 8}]),
    ({"ppo_mini_batch_size": 7}, "mini_batch_divisible_by_dp", [{"ppo_mini_batch_size": 8}]),
    ({"pins": {"rollout.tensor_model_parallel_size": 3}}, "rollout_tp_divides_world",
     [{"pins": {"rollout.tensor_model_parallel_size": 2}}]),
])
def test_a_broken_batch_rule_is_named_before_memory_with_the_nearest_valid_values_that_fit(changes, rule, fixed):
    request = attrs.evolve(request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=1024, response=2048, batch=256,
                                       n=5), **changes)
    result = solve(request)
    assert result.best is None and result.diagnosis is not None
    assert result.diagnosis.binding.startswith(f"verl rule `{rule}`")
    assert "kv_cache" not in result.diagnosis.message
    for change in fixed:
        flag, value = next(iter(change.items()))
        if flag == "pins":
            key, number = next(iter(value.items()))
            assert any(s.change == f"--fix {key}={number}" for s in result.diagnosis.suggestions)
        else:
            assert any(s.change == f"--{flag.replace('_', '-')} {value}" for s in result.diagnosis.suggestions)
        repaired = solve(attrs.evolve(request, **change))
        assert repaired.plan is not None and check_plan(repaired.plan).valid


def test_critic_memory_knobs_are_searched_apart_from_the_actors():
    request = request_for("llama-3.1-8b", gpus=8, gpu_mem=24.0, prompt=512, response=512, batch=32, n=1,
                          algorithm="gae")
    choices = list(training_choices(request, 1024))
    critic_knobs = {(c.critic_param_offload, c.critic_optimizer_offload, c.critic_gradient_checkpointing)
                    for c in choices if not c.param_offload and not c.optimizer_offload}
    # The critic may offload while the actor keeps its state on the GPU.
    assert (True, True, True) in critic_knobs and (False, False, False) in critic_knobs
    plan = solve(request).plan
    assert plan is not None and check_plan(plan).valid and predict_memory(plan, DEFAULT_PROFILE).fits


def test_pinned_critic_offload_is_kept():
    pins = {"critic.optimizer_offload": True, "critic.param_offload": False}
    plan = solve(request_for("qwen2.5-0.5b", gpus=2, gpu_mem=24.0, prompt=256, response=256, batch=8, n=2,
                             algorithm="gae", pins=pins)).plan
    assert plan is not None and plan.critic.optimizer_offload and not plan.critic.param_offload


def preset_request(model: str, gpu: str, gpus: int, *, host_mem: float = 1024.0, **changes) -> SolveRequest:
    from rlplan.planner.presets import resolve_gpu

    resolved = resolve_model(model)
    per_node = min(gpus, 8)
    return SolveRequest(
        model=ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch),
        cluster=Cluster(gpu=resolve_gpu(gpu), nodes=gpus // per_node, gpus_per_node=per_node,
                        host_memory_gib=host_mem),
        prompt_len=1024, response_len=2048, **changes,
    )


def _apply_suggestion(request: SolveRequest, change: str) -> SolveRequest:
    """A suggestion's flags applied to the request, as the CLI would read them."""
    from rlplan.planner.presets import resolve_gpu
    flags = dict(zip(change.split()[::2], change.split()[1::2], strict=True))
    cluster = request.cluster
    if "--gpu" in flags:
        cluster = attrs.evolve(cluster, gpu=resolve_gpu(flags["--gpu"]))
    if "--gpus" in flags:  # laid out as `solve` does: nodes of min(gpus, 8), or of --gpus-per-node
        total = int(flags["--gpus"])
        per_node = int(flags.get("--gpus-per-node", min(total, 8)))
        cluster = attrs.evolve(cluster, nodes=total // per_node, gpus_per_node=per_node)
    if "--host-mem" in flags:
        cluster = attrs.evolve(cluster, host_memory_gib=float(flags["--host-mem"]))
    # The run's own flags, as solve_commands reads them.
    changed: dict = {name: int(flags[flag]) for flag, name in (
        ("--response-len", "response_len"), ("--prompt-len", "prompt_len"), ("--n", "n"),
        ("--train-batch-size", "train_batch_size"), ("--lora", "lora")) if flag in flags}
    if "--train-batch-size" in flags and request.ppo_mini_batch_size is not None:
        changed["ppo_mini_batch_size"] = min(request.ppo_mini_batch_size, changed["train_batch_size"])
    if "--headroom" in flags:
        from rlplan.planner.model_error import parse_headroom

        changed["headroom"] = parse_headroom(flags["--headroom"])
    return attrs.evolve(request, cluster=cluster, **changed)


@pytest.mark.parametrize(("model", "gpu", "gpus", "host_mem", "lora", "expected_flag"), [
    ("llama-3.1-70b", "h100-80g", 16, 1024.0, "off", "--gpus"),
    ("qwen2.5-72b", "rtx4090-24g", 1, 1024.0, "auto", "--gpu"),
    ("llama-3.1-405b", "h100-80g", 64, 512.0, "auto", "--host-mem"),
])
def test_nothing_fits_suggests_changes_that_fit_on_a_gpu_at_least_as_fast(model, gpu, gpus, host_mem, lora,
                                                                        expected_flag):
    from rlplan.planner.presets import resolve_gpu

    # Without the CPU offload policy, which would fit the 70B's full fine-tuning state into host RAM.
    request = preset_request(model, gpu, gpus, host_mem=host_mem, lora=lora, pins={"actor.offload_policy": False})
    diagnosis = solve(request).diagnosis
    assert diagnosis is not None
    hardware = [s for s in diagnosis.suggestions if s.kind == "hardware"]
    assert 1 <= len(hardware) <= 3, diagnosis
    assert any(expected_flag in s.change.split() for s in hardware), diagnosis.message
    for suggestion in diagnosis.suggestions:
        fixed = _apply_suggestion(request, suggestion.change)
        assert fixed.cluster.gpu.bf16_tflops >= resolve_gpu(gpu).bf16_tflops  # never a slower GPU
        plan = solve(fixed).plan
        assert plan is not None and check_plan(plan).valid, suggestion.change


def test_objective_memory_leaves_headroom_on_every_phase():
    from rlplan.planner.solver.budgets import MEMORY_OBJECTIVE_HEADROOM

    request = preset_request("qwen2.5-7b", "a100-40g", 8, objective="memory")
    plan = solve(request).plan
    assert plan is not None
    report = predict_memory(plan, DEFAULT_PROFILE)
    assert max(p.peak_bytes for p in report.phases) <= (1 - MEMORY_OBJECTIVE_HEADROOM) * report.gpu_capacity_bytes
    filled = solve(attrs.evolve(request, objective="throughput")).plan
    assert filled is not None and filled.prediction.gpu_peak_gib > plan.prediction.gpu_peak_gib


PIN_CHOICES = {
    "actor.param_offload": st.booleans(),
    "actor.optimizer_offload": st.booleans(),
    "model.gradient_checkpointing": st.booleans(),
    "ref.param_offload": st.booleans(),
    "critic.optimizer_offload": st.booleans(),
    "actor.offload_policy": st.booleans(),
    "critic.offload_policy": st.booleans(),
    "model.lora.rank": st.sampled_from([0, 32]),
    "rollout.gpu_memory_utilization": st.sampled_from([0.3, 0.5, 0.7]),
    "rollout.tensor_model_parallel_size": st.sampled_from([1, 2]),
    "rollout.max_num_seqs": st.sampled_from([16, 64, 256]),
    "actor.ppo_max_token_len_per_gpu": st.sampled_from([4096, 8192]),
    "actor.use_kl_loss": st.booleans(),
}


@st.composite
def pinned_requests(draw):
    gpus = draw(st.sampled_from([2, 4, 8]))
    keys = draw(st.lists(st.sampled_from(sorted(PIN_CHOICES)), max_size=3, unique=True))
    pins = {key: draw(PIN_CHOICES[key]) for key in keys}
    return request_for(
        draw(st.sampled_from(["qwen2.5-0.5b", "qwen2.5-7b"])), gpus=gpus,
        gpu_mem=draw(st.sampled_from([24.0, 80.0])), prompt=draw(st.sampled_from([256, 1024])),
        response=draw(st.sampled_from([512, 2048])), batch=2 * gpus * draw(st.integers(1, 8)),
        n=draw(st.sampled_from([2, 4])), lora=draw(st.sampled_from(["auto", "off"])),
        algorithm=draw(st.sampled_from(["grpo", "gae"])), pins=pins,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pinned_requests())
def test_every_plan_solve_writes_passes_validate_and_keeps_every_pinned_value(request):
    from rlplan.planner.planfile import plan_from_toml, plan_to_toml
    from rlplan.planner.report import validation_json

    plan = solved_plan(request)
    if plan is None:
        return
    written = plan_from_toml(plan_to_toml(plan))  # what `solve -o` writes and `validate` reads
    verdict = validation_json(written, request.profile)
    assert verdict["valid"] and verdict["feasible"], (verdict["errors"], request.pins)
    for dotted, value in request.pins.items():
        actual: object = written
        for name in dotted.split("."):
            actual = getattr(actual, name)
        assert actual == value, (dotted, actual, value)


def test_ppo_8b_on_four_24g_gpus_solves_with_the_critic_state_in_host_ram():
    # The full-parameter critic's fp32 params, grads and AdamW state are ~30 GiB per rank on 4 ranks:
    # only FSDP2's CPUOffloadPolicy (verl's fsdp_config.offload_policy) takes them off the GPU for the update.
    from rlplan.planner.planfile import plan_from_toml, plan_to_dict, plan_to_toml
    from rlplan.planner.render import plan_as_verl_runs_it, render_plan
    from rlplan.planner.verl_import import import_verl_script

    request = request_for("llama-3.1-8b", gpus=4, gpu_mem=24.0, prompt=512, response=512, batch=32, n=1,
                          algorithm="gae")
    plan = solve(request).plan
    assert plan is not None and plan.uses_critic and plan.critic.offload_policy
    assert check_plan(plan).valid and predict_memory(plan, DEFAULT_PROFILE).fits
    assert plan_to_dict(plan_from_toml(plan_to_toml(plan))) == plan_to_dict(plan)
    back = import_verl_script(render_plan(plan, "verl"), gpu=plan.cluster.gpu,
                              host_memory_gib=plan.cluster.host_memory_gib, env={},
                              local_config_reader=lambda path: None).plan
    # The import's inferred range of releases (stack.verl_oldest) describes the script, not the plan.
    assert plan_to_dict(without_inferred_range(back)) == plan_to_dict(plan_as_verl_runs_it(plan))
    assert "critic.fsdp.offload_policy=true" in render_plan(plan, "verl", "overrides")


def test_ppo_8b_on_four_24g_gpus_without_the_offload_policy_names_the_critic_update_and_changes_that_fit():
    # Offloaded between steps, the critic's state still comes back to the GPU for its update (~43 GiB on 4 ranks).
    request = request_for("llama-3.1-8b", gpus=4, gpu_mem=24.0, prompt=512, response=512, batch=32, n=1,
                          algorithm="gae", pins={"critic.offload_policy": False, "actor.offload_policy": False})
    result = solve(request)
    assert result.best is None and result.diagnosis is not None
    assert "critic_update" in result.diagnosis.binding
    assert result.diagnosis.suggestions
    for suggestion in result.diagnosis.suggestions:
        fixed = _apply_suggestion(request, suggestion.change)
        plan = solve(fixed).plan
        assert plan is not None and check_plan(plan).valid, suggestion.change


@pytest.mark.parametrize(("pins", "field"), [
    ({"cluster.gpus_per_node": 3}, "cluster.gpus_per_node"),
    ({"cluster.nodes": 2}, "cluster.nodes"),
    ({"rollout.tensor_model_parallel_size": 16}, "rollout.tensor_model_parallel_size"),
])
def test_pins_that_do_not_fit_the_clusters_gpus_are_bad_input_naming_the_key(pins, field):
    request = request_for("qwen2.5-7b", gpus=8, gpu_mem=80, prompt=1024, response=2048, batch=64, n=4, pins=pins)
    with pytest.raises(PlanError) as error:
        solve(request)
    assert error.value.field == field


# --- the margin solve keeps (issue 23) ------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_no_plan_solve_writes_with_default_settings_leaves_less_than_the_default_margin(request):
    from rlplan.planner.model_error import plan_margin

    plan = solved_plan(request)
    if plan is None:
        return
    margin = plan_margin(plan, profile=request.profile)
    assert margin.default and margin.bytes > 0
    report = predict_memory(plan, request.profile)
    for phase in report.phases:
        assert phase.peak_bytes <= report.gpu_capacity_bytes - margin.bytes, (phase.name, margin.rule)


def issue_request(model: str, gpu: str, gpus: int, response: int, **changes) -> SolveRequest:
    """A request of the issue, on the host RAM its GPU preset assumes."""
    from rlplan.planner.presets import resolve_gpu, typical_host_memory

    resolved, spec = resolve_model(model), resolve_gpu(gpu)
    per_node = min(gpus, 8)
    return SolveRequest(
        model=ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch),
        cluster=Cluster(gpu=spec, nodes=gpus // per_node, gpus_per_node=per_node,
                        host_memory_gib=typical_host_memory(spec, per_node).gib),
        prompt_len=1024, response_len=response, **changes)


@pytest.mark.parametrize(("model", "gpu", "gpus", "response"), [
    ("qwen2.5-7b", "h100-80g", 8, 2048),      # the README's planning line: was 78.68 of 79.18 GiB
    ("llama-3.1-8b", "h100-80g", 8, 32768),   # was 79.14 of 79.18
    ("qwen2.5-72b", "h100-80g", 32, 2048),    # was 79.03 of 79.18
    ("qwen2.5-1.5b", "rtx4090-24g", 1, 2048),  # was 23.46 of 23.52
])
def test_the_issues_packed_plans_now_leave_the_default_margin(model, gpu, gpus, response):
    from rlplan.planner.model_error import plan_margin

    result = solve(issue_request(model, gpu, gpus, response))
    assert result.best is not None
    report = result.best.memory
    margin = plan_margin(result.plan)
    assert margin.fraction >= DEFAULT_PROFILE.headroom_floor_fraction
    assert report.gpu_capacity_bytes - report.gpu_peak_bytes >= margin.bytes


def test_the_readme_request_keeps_its_margin_at_no_cost_in_step_time():
    from rlplan.planner.model_error import Headroom
    from rlplan.planner.solver import STEP_TIME_TOLERANCE

    request = issue_request("qwen2.5-7b", "h100-80g", 8, 2048)
    kept, packed = solve(request).best, solve(attrs.evolve(request, headroom=Headroom(gib=0.0))).best
    assert kept is not None and packed is not None
    assert kept.step_time.total_seconds <= packed.step_time.total_seconds * (1 + STEP_TIME_TOLERANCE)
    assert kept.memory.gpu_peak_bytes < packed.memory.gpu_peak_bytes


@pytest.mark.parametrize("fraction", [0.1, 0.2])
def test_headroom_as_a_share_of_the_gpu_is_left_free_on_every_phase(fraction):
    from rlplan.planner.model_error import Headroom

    request = attrs.evolve(issue_request("qwen2.5-7b", "h100-80g", 8, 2048), headroom=Headroom(fraction=fraction))
    plan = solve(request).plan
    assert plan is not None
    report = predict_memory(plan, DEFAULT_PROFILE)
    assert all(p.peak_bytes <= (1 - fraction) * report.gpu_capacity_bytes for p in report.phases)


def test_among_candidates_as_fast_as_the_best_solve_takes_the_one_leaving_most_memory():
    from rlplan.planner.solver import STEP_TIME_TOLERANCE

    result = solve(issue_request("qwen2.5-7b", "h100-80g", 8, 2048), keep=100)
    candidates = [result.best, *result.runners_up]
    fastest = min(c.step_time.total_seconds for c in candidates)
    near = [c for c in candidates if c.step_time.total_seconds <= fastest * (1 + STEP_TIME_TOLERANCE)]
    assert result.best in near
    assert result.best.memory.gpu_peak_bytes == min(c.memory.gpu_peak_bytes for c in near)


def test_the_rollout_takes_the_smallest_utilization_that_runs_as_many_sequences_at_once():
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.memory.rollout import rollout_budget

    plan = solve(issue_request("qwen2.5-7b", "h100-80g", 8, 2048)).plan
    assert plan is not None
    at_once = min(plan.rollout.max_num_seqs, -(-plan.data.train_batch_size * plan.rollout.n
                                               // plan_layout(plan).parallel.rollout_replicas))
    assert rollout_budget(plan).max_concurrent_sequences >= at_once
    lower = plan.evolve(rollout=attrs.evolve(plan.rollout,
                                             gpu_memory_utilization=plan.rollout.gpu_memory_utilization - 0.01))
    budget = rollout_budget(lower)
    assert budget.max_concurrent_sequences < at_once or not budget.holds_max_model_len


def test_70b_full_fine_tuning_on_8_a100_40g_offers_16_gpus_among_the_fixes():
    request = issue_request("llama-3.1-70b", "a100-40g", 8, 2048, lora="off")
    diagnosis = solve(request).diagnosis
    assert diagnosis is not None
    more = [s for s in diagnosis.suggestions if s.more_gpus]
    assert len(more) == 1 and more[0].change.split()[:2] == ["--gpus", "16"], diagnosis.message
    fixed = solve(_apply_suggestion(request, more[0].change))
    assert fixed.plan is not None and check_plan(fixed.plan).valid
    # The issue: the host-RAM change costs ~2x the step time of 16 GPUs.
    host = [s for s in diagnosis.suggestions if s.change.startswith("--host-mem")]
    assert host and more[0].step_time_s < 0.6 * host[0].step_time_s


def test_more_gpus_is_the_nearest_count_that_verl_accepts_and_fits():
    from rlplan.planner.solver.solve import (
        _fewest_more_gpus,
        _fits,
        cluster_with_gpus,
        request_rule_violations,
    )

    request = request_for("qwen2.5-7b", gpus=1, gpu_mem=24.0, prompt=1024, response=8192, batch=8, n=3, lora="off",
                          pins={"actor.offload_policy": False})
    found = _fewest_more_gpus(request, 8192)
    assert found is not None
    count = found[0].cluster.world_size
    assert count > 1 and not request_rule_violations(found[0], 8192) and _fits(found[0], 8192)
    for smaller in range(2, count):
        cluster = cluster_with_gpus(request.cluster, smaller)
        if cluster is None:
            continue
        fewer = attrs.evolve(request, cluster=attrs.evolve(cluster, host_memory_gib=found[0].cluster.host_memory_gib))
        assert request_rule_violations(fewer, 8192) or not _fits(fewer, 8192), smaller


def test_a_node_below_what_every_plan_holds_in_host_ram_is_refused_before_any_search():
    """Issue 41: at --host-mem 8 a 30B MoE searched every layout for 40-120 s before saying nothing fits. The model's
    shared-memory copy and the GPU processes are in every plan's host RAM (memory.phases.host_floor): below them,
    the diagnosis comes before the search and names the host RAM that fits."""
    from rlplan.planner.memory.phases import host_floor

    request = request_for("qwen2.5-7b", gpus=8, gpu_mem=80.0, prompt=512, response=512, batch=64, n=4)
    starved = attrs.evolve(request, cluster=attrs.evolve(request.cluster, host_memory_gib=8.0))
    result = solve(starved)
    assert result.best is None and result.evaluated == 0
    assert result.diagnosis is not None and result.diagnosis.binding == "host RAM"
    assert "model_copy_shm" in result.diagnosis.message and "--host-mem" in result.diagnosis.message
    (suggestion,) = result.diagnosis.suggestions
    host = float(suggestion.change.removeprefix("--host-mem "))
    fixed = solve(attrs.evolve(request, cluster=attrs.evolve(request.cluster, host_memory_gib=host)))
    assert fixed.plan is not None
    # The floor is a floor: every solved plan holds at least it on the host.
    floor = host_floor(fixed.plan)
    assert predict_memory(fixed.plan, DEFAULT_PROFILE).host.total_bytes >= floor.total_bytes > 8 * 2**30


def test_a_small_card_is_offered_changes_of_the_run_that_fit_on_it_beside_hardware_each_group_ranked_as_said():
    """Issue 35 item 5: a 7B LoRA run on one RTX 4090 was offered only a 5090, an A100 or a second 4090, with no
    word of what would fit on the card one has. Now the diagnosis lists the run changed on the user's card and a
    smaller margin beside the hardware, each group ranked by the criterion it names, and each change re-solves to
    a valid plan on that card."""
    from rlplan.planner.solver import RANKED_BY

    request = preset_request("qwen2.5-7b", "rtx4090-24g", 1, host_mem=64.0, lora=16)
    request = attrs.evolve(request, prompt_len=512, response_len=512)
    diagnosis = solve(request).diagnosis
    assert diagnosis is not None
    kinds = [s.kind for s in diagnosis.suggestions]
    assert "hardware" in kinds and "workload" in kinds and "margin" in kinds, diagnosis.message
    assert kinds == sorted(kinds, key=["hardware", "workload", "margin"].index)  # grouped, in that order
    on_card = [s for s in diagnosis.suggestions if s.kind in ("workload", "margin")]
    for suggestion in on_card:
        fixed = _apply_suggestion(request, suggestion.change)
        assert fixed.cluster == request.cluster, suggestion.change
        plan = solve(fixed).plan
        assert plan is not None and check_plan(plan).valid, suggestion.change
    workload = [s for s in diagnosis.suggestions if s.kind == "workload"]
    kept = [(s.tokens_kept, -(s.step_time_s or 0)) for s in workload]
    assert kept == sorted(kept, reverse=True) and all(0 < s.tokens_kept <= 1 for s in workload)
    for kind in set(kinds):
        assert RANKED_BY[kind] in diagnosis.message


def test_the_margin_change_is_the_largest_margin_that_fits_and_says_what_it_gives_up():
    request = preset_request("qwen2.5-7b", "rtx4090-24g", 1, host_mem=64.0, lora=16)
    request = attrs.evolve(request, prompt_len=512, response_len=512)
    diagnosis = solve(request).diagnosis
    assert diagnosis is not None
    (margin,) = [s for s in diagnosis.suggestions if s.kind == "margin"]
    assert margin.change.startswith("--headroom") and "model's error" in margin.detail
    assert margin.tokens_kept == 1.0 and margin.keeps_workload


def test_the_solver_never_emits_a_utilization_vllm_refuses_to_start_at():
    """vLLM V1 from 0.9.1 refuses to start when the GPU's free memory (the trainer's state resident when verl builds
    the engine taken) is below util x GPU (memory/rollout.py free_at_engine_start): a solved plan's utilization is at
    most the largest that starts, and a pinned one above it is refused, where vLLM 0.9.0 (no such test) has none."""
    from rlplan.planner.memory.rollout import (
        largest_starting_utilization,
        rollout_budget,
        trainer_bytes_at_engine_start,
    )

    stack = {"stack.verl": "0.6.0", "stack.vllm": "0.9.1"}
    resident = {"actor.param_offload": False, "actor.optimizer_offload": False, "actor.offload_policy": False}
    request = request_for("qwen3-8b", gpus=1, gpu_mem=80.0, prompt=512, response=1024, batch=32, n=4, lora=32,
                          pins={**stack, **resident})
    plan = solve(request).plan
    assert plan is not None
    budget = rollout_budget(plan)
    lower = largest_starting_utilization(budget, plan.cluster.gpu_memory_bytes)
    assert budget.free_at_start_bytes is not None and budget.starts
    assert trainer_bytes_at_engine_start(plan) > 20 * 2**30  # the base model's parameters stay on the GPU
    assert lower is not None and plan.rollout.gpu_memory_utilization <= lower < 0.9
    above = round(lower + 0.02, 2)
    refused = solve(attrs.evolve(request, pins={**request.pins, "rollout.gpu_memory_utilization": above}))
    assert refused.plan is None
    assert rollout_budget(plan.evolve(stack=attrs.evolve(plan.stack, vllm="0.9.0"))).free_at_start_bytes is None
