"""The roofline step-time model (planner/steptime.py): it must order plans the way the hardware would."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.memory import predict_memory
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime import StepTime, predict_step_time
from tests.planner.plans import QWEN25_7B, make_plan
from tests.repo_scripts import load_script


def step_time(plan: Plan) -> StepTime:
    return predict_step_time(plan, predict_memory(plan), DEFAULT_PROFILE)


@st.composite
def knobs(draw):
    return {
        "model.gradient_checkpointing": draw(st.booleans()),
        "model.activation_offload": draw(st.booleans()),
        "model.lora.rank": draw(st.sampled_from([0, 32])),
        "actor.use_kl_loss": draw(st.booleans()),
        "algorithm.adv_estimator": draw(st.sampled_from(["grpo", "gae"])),
        "critic.ppo_micro_batch_size_per_gpu": 2,
        "rollout.tensor_model_parallel_size": draw(st.sampled_from([1, 2, 4])),
        "rollout.sleep_level": draw(st.sampled_from([1, 2])),
        "data.train_batch_size": draw(st.sampled_from([64, 256])),
    }


OFFLOADS = ["actor.param_offload", "actor.optimizer_offload", "ref.param_offload", "critic.param_offload",
            "critic.optimizer_offload"]


@settings(max_examples=40, deadline=None)
@given(base=knobs(), offload=st.sampled_from(OFFLOADS))
def test_offloading_never_makes_a_step_faster(base, offload):
    on, off = step_time(make_plan(overrides={**base, offload: True})), step_time(make_plan(overrides=base))
    assert on.total_seconds >= off.total_seconds
    plan = make_plan(overrides=base)
    moves_state = {
        # On GPUs verl offloads a separate reference whatever the key says: the key changes nothing there.
        "ref.param_offload": False,
        "critic.param_offload": plan.uses_critic,
        "critic.optimizer_offload": plan.uses_critic,
    }.get(offload, True)
    if moves_state:
        # verl times each load and offload inside the call that makes it (steptime/fsdp.py _forward_moves,
        # _update_moves, the weight sync's), so the step itself grows.
        assert on.total_seconds > off.total_seconds


@settings(max_examples=40, deadline=None)
@given(base=knobs(), low=st.sampled_from([0.3, 0.4, 0.5]), raise_by=st.sampled_from([0.1, 0.2, 0.4]))
def test_more_kv_cache_never_slows_decoding(base, low, raise_by):
    """A bigger budget costs more to wake and put to sleep (engine_wake_sleep_seconds_per_gib); the decode it
    holds never slows."""
    no_wake = attrs.evolve(DEFAULT_PROFILE, engine_wake_sleep_seconds_per_gib=0.0)
    slow = make_plan(overrides={**base, "rollout.gpu_memory_utilization": low})
    fast = make_plan(overrides={**base, "rollout.gpu_memory_utilization": low + raise_by})
    assert (predict_step_time(fast, predict_memory(fast), no_wake).phase_seconds["rollout"]
            <= predict_step_time(slow, predict_memory(slow), no_wake).phase_seconds["rollout"])


def test_kv_limited_concurrency_makes_rollout_faster_when_it_binds():
    """4096 sequences over 8 replicas at long mean lengths: the KV cache, not max_num_seqs, caps how many
    decode together, and below the engine's host-bound knee more of them read the weights once."""
    overrides = {"data.train_batch_size": 512, "rollout.n": 8, "actor.ppo_mini_batch_size": 64,
                 "rollout.max_num_seqs": 1024, "data.max_response_length": 4096,
                 "rollout.max_model_len": 4608, "data.expected_prompt_length": 512,
                 "data.expected_response_length": 4096}
    tight = make_plan(overrides={**overrides, "rollout.gpu_memory_utilization": 0.4})
    roomy = make_plan(overrides={**overrides, "rollout.gpu_memory_utilization": 0.8})
    tight_memory, roomy_memory = predict_memory(tight), predict_memory(roomy)
    assert tight_memory.max_concurrent_sequences < roomy_memory.max_concurrent_sequences < 512
    assert step_time(roomy).phase_seconds["rollout"] < 0.8 * step_time(tight).phase_seconds["rollout"]


def test_gradient_checkpointing_is_slower_per_token_but_fits_bigger_micro_batches():
    plain = make_plan(overrides={"model.gradient_checkpointing": False})
    checkpointed = make_plan(overrides={"model.gradient_checkpointing": True})
    assert step_time(checkpointed).phase_seconds["actor_update"] > step_time(plain).phase_seconds["actor_update"]
    assert (predict_memory(checkpointed).phase("actor_update").peak_bytes
            < predict_memory(plain).phase("actor_update").peak_bytes)


@settings(max_examples=40, deadline=None)
@given(base=knobs(), micro=st.sampled_from([1, 2, 4, 8]), gpus=st.sampled_from([8, 16]))
def test_smaller_micro_batches_never_make_an_update_faster(base, micro, gpus):
    """Each micro batch re-gathers the weights; fewer, bigger ones amortise the collectives.

    256 prompts x 4 over at most 16 GPUs leave >= 16 sequences per mini batch, so 2 x micro divides it.
    """
    def update_seconds(size):
        plan = make_plan(gpus=gpus, overrides={**base, "actor.ppo_micro_batch_size_per_gpu": size,
                                               "data.train_batch_size": 256, "actor.ppo_mini_batch_size": 64})
        return step_time(plan).phase_seconds["actor_update"]

    assert update_seconds(micro) >= update_seconds(2 * micro) * (1 - 1e-12)


def test_update_time_is_the_flop_roofline_at_the_mean_lengths_when_collectives_hide():
    """Remove padding packs real tokens: the update computes 64 x 4 sequences of the 768 mean tokens,
    not 1536."""
    plan = make_plan(overrides={"model.gradient_checkpointing": False,
                                "actor.ppo_micro_batch_size_per_gpu": 8,
                                "data.expected_prompt_length": 256, "data.expected_response_length": 512})
    no_fixed_costs = attrs.evolve(DEFAULT_PROFILE, micro_batch_seconds_per_layer=0.0,
                                  optimizer_step_seconds_per_layer=0.0, worker_call_seconds=0.0, dataproto_gbps=1e3)
    seconds = predict_step_time(plan, predict_memory(plan), no_fixed_costs).phase_seconds["actor_update"]
    tokens_per_gpu = 64 * 4 * 768 / 8
    flops = 3 * QWEN25_7B.forward_flops_per_token(384) * tokens_per_gpu
    roofline = flops / (plan.cluster.gpu.bf16_tflops * 1e12 * DEFAULT_PROFILE.training_mfu)
    # Four optimizer steps (16-prompt mini batches), each an fp32 AdamW pass over the shard in HBM.
    hbm = plan.cluster.gpu.hbm_gbps * 1e9 * DEFAULT_PROFILE.decode_hbm_efficiency
    adamw = 4 * 28 * QWEN25_7B.total_params / 8 / hbm
    assert seconds == pytest.approx(roofline + adamw, rel=0.01)


def test_dropping_the_fixed_costs_leaves_the_roofline_and_they_are_what_a_small_model_pays_most():
    """The worker call, its DataProto, the micro batches' and optimizer steps' host work add to every pass; on
    a 0.5B-class model they outweigh the FLOPs (issue 40)."""
    plan = make_plan(overrides={"data.expected_prompt_length": 100, "data.expected_response_length": 200})
    full = step_time(plan).phase_seconds
    bare = predict_step_time(plan, predict_memory(plan), attrs.evolve(
        DEFAULT_PROFILE, micro_batch_seconds_per_layer=0.0, optimizer_step_seconds_per_layer=0.0,
        worker_call_seconds=0.0, dataproto_gbps=1e3)).phase_seconds
    assert all(full[phase] >= bare[phase] for phase in bare)
    assert full["actor_update"] > bare["actor_update"]


def test_decode_cannot_beat_reading_the_weights_once_per_token():
    plan = make_plan(overrides={"data.train_batch_size": 8, "rollout.n": 1, "actor.ppo_mini_batch_size": 8,
                                "actor.ppo_micro_batch_size_per_gpu": 1,
                                "data.expected_response_length": 1024})
    one_sequence_per_replica = step_time(plan).phase_seconds["rollout"]
    gpu = plan.cluster.gpu
    weight_reads = 1024 * 2 * QWEN25_7B.total_params / (gpu.hbm_gbps * 1e9 * DEFAULT_PROFILE.decode_hbm_efficiency)
    assert one_sequence_per_replica >= weight_reads


def test_adapter_only_sync_is_faster_than_full_weights_and_sleep_level_one_costs_pcie():
    full = step_time(make_plan()).phase_seconds["weight_sync"]
    adapter = step_time(make_plan(overrides={"model.lora.rank": 32, "rollout.load_format": "safetensors"}))
    level_one = step_time(make_plan(overrides={"rollout.sleep_level": 1})).phase_seconds["weight_sync"]
    assert adapter.phase_seconds["weight_sync"] < full / 10
    assert level_one > full


def test_step_phases_mirror_the_memory_phases_plus_offload_traffic():
    plan = make_plan(overrides={"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2,
                                "actor.use_kl_loss": True})
    memory = predict_memory(plan)
    seconds = predict_step_time(plan, memory).phase_seconds
    assert set(seconds) == {p.name for p in memory.phases} | {"offload", "reward", "adv"}
    assert all(value >= 0 for value in seconds.values())
    assert predict_step_time(plan, memory).total_seconds == pytest.approx(sum(seconds.values()))


@settings(max_examples=30, deadline=None)
@given(base=knobs(), role=st.sampled_from(["actor", "critic"]))
def test_cpu_offload_policy_never_makes_a_step_faster_and_slows_its_roles_update(base, role):
    plan = make_plan(overrides=base)
    on = step_time(make_plan(overrides={**base, f"{role}.offload_policy": True}))
    off = step_time(plan)
    assert on.total_seconds >= off.total_seconds
    if role == "actor" or plan.uses_critic:
        # The optimizer steps on the CPU and every pass copies the host shards in.
        assert on.phase_seconds[f"{role}_update"] > off.phase_seconds[f"{role}_update"]


# --- issue 29: real lengths, decode cost, MFU per GPU class, each pass as verl runs it ---------------


def _sweeps_module():
    return load_script("benchmarks/steptime_sweeps.py")


@settings(max_examples=30, deadline=None)
@given(base=knobs(), response=st.sampled_from([128, 256, 512]), prompt=st.sampled_from([64, 256]))
def test_shorter_stated_means_never_make_a_phase_slower(base, response, prompt):
    """Every phase runs at the data's mean lengths: the maxima no longer price a step whose data is short."""
    def phases(prompt_len: int, response_len: int) -> dict[str, float]:
        plan = make_plan(overrides={**base, "data.expected_prompt_length": prompt_len,
                                    "data.expected_response_length": response_len})
        return step_time(plan).phase_seconds

    short, full = phases(prompt, response), phases(512, 1024)
    for phase in ("rollout", "old_log_prob", "actor_update"):
        assert short[phase] <= full[phase] * (1 + 1e-9), phase
    assert short["rollout"] < full["rollout"]


@settings(max_examples=40, deadline=None)
@given(mean=st.integers(16, 4096), sigma=st.floats(0.05, 1.0), raise_by=st.floats(0.05, 1.0),
       count=st.sampled_from([256, 1024, 4096]))
def test_a_heavier_tail_keeps_the_mean_and_never_shortens_the_longest_response(mean, sigma, raise_by, count):
    """The longest of a batch is its 1 - 1/(count+1) quantile, exp(log_median + sigma z): it grows with the
    tail while z > sigma, i.e. for batches of hundreds of sequences and shapes up to 2 (z = 2.66 at 256)."""
    from rlplan.planner.steptime import Lengths

    narrow, wide = (Lengths(prompt_mean=100.0, response_mean=float(mean), response_max=8192, sigma=shape)
                    for shape in (sigma, sigma + raise_by))
    # The cut distribution's mean is the stated one: the tail reshapes the batch, not its tokens.
    for lengths in (narrow, wide):
        positions = [8192 * (i + 0.5) / 4096 for i in range(4096)]
        cut_mean = sum(lengths.survival(t) for t in positions) * 8192 / 4096
        assert cut_mean == pytest.approx(mean, rel=0.02, abs=2)
    assert wide.longest_of(count) >= narrow.longest_of(count) * (1 - 1e-9)


@settings(max_examples=20, deadline=None)
@given(base=knobs(), low=st.sampled_from([0.2, 0.4, 0.6]), raise_by=st.sampled_from([0.2, 0.4]))
def test_a_heavier_response_tail_never_makes_the_rollout_faster_below_the_cut(base, low, raise_by):
    """Same mean, longer longest responses (still short of max_response_length): the batch waits for them."""
    plan = make_plan(overrides={**base, "data.max_response_length": 8192, "rollout.max_model_len": 8704,
                                "data.expected_response_length": 128})
    memory = predict_memory(plan)

    def rollout(sigma: float) -> float:
        profile = attrs.evolve(DEFAULT_PROFILE, response_length_sigma=sigma)
        return predict_step_time(plan, memory, profile).phase_seconds["rollout"]

    assert rollout(low + raise_by) >= rollout(low) * (1 - 1e-9)


def test_eager_decode_is_slower_than_cuda_graphs():
    graphs = make_plan(overrides={"data.expected_response_length": 256})
    eager = make_plan(overrides={"data.expected_response_length": 256, "rollout.enforce_eager": True})
    assert step_time(eager).phase_seconds["rollout"] > step_time(graphs).phase_seconds["rollout"]


def test_a_dapo_generation_batch_generates_its_prompts_not_the_train_batch():
    """recipe.dapo generates gen_batch_size prompts and trains train_batch_size of them."""
    train = make_plan(overrides={"data.expected_response_length": 256})
    generate_3x = make_plan(overrides={"data.expected_response_length": 256, "data.gen_batch_size": 192})
    assert step_time(generate_3x).phase_seconds["rollout"] > step_time(train).phase_seconds["rollout"]
    update = step_time(train).phase_seconds["actor_update"]
    assert step_time(generate_3x).phase_seconds["actor_update"] == update


def test_the_reference_pass_skips_the_entropy_the_old_log_prob_pass_computes():
    plan = make_plan(overrides={"actor.use_kl_loss": True, "ref.log_prob_micro_batch_size_per_gpu": 4,
                                "model.lora.rank": 32})
    seconds = step_time(plan).phase_seconds
    assert seconds["ref_log_prob"] < seconds["old_log_prob"]


def test_a_flop_poor_gpu_reaches_a_higher_mfu_than_a_flop_dense_one():
    from rlplan.planner.presets import resolve_gpu
    from rlplan.planner.steptime import training_mfu_key

    h100, h20 = (make_plan().evolve(cluster=attrs.evolve(make_plan().cluster, gpu=resolve_gpu(name)))
                 for name in ("h100-80g", "h20-96g"))
    assert training_mfu_key(h100) == "training_mfu"
    assert training_mfu_key(h20) == "training_mfu_light_gpu"
    assert DEFAULT_PROFILE.training_mfu_light_gpu > DEFAULT_PROFILE.training_mfu


def test_a_small_model_runs_below_its_flops_roofline():
    """Fixed costs per micro batch (launches, hooks) dominate a 0.5B model's update, not its FLOPs."""
    from rlplan.planner.presets import resolve_model

    plan = make_plan(resolve_model("qwen2.5-0.5b").arch, overrides={"data.expected_response_length": 256})
    without = attrs.evolve(DEFAULT_PROFILE, micro_batch_seconds_per_layer=0.0)
    memory = predict_memory(plan)
    with_fixed = predict_step_time(plan, memory).phase_seconds["actor_update"]
    roofline = predict_step_time(plan, memory, without).phase_seconds["actor_update"]
    assert with_fixed > 1.5 * roofline


def test_verl_timings_sum_the_phases_the_way_verl_times_them():
    from rlplan.planner.steptime import verl_timing_seconds

    plan = make_plan(overrides={"actor.use_kl_loss": True, "actor.param_offload": True})
    step = step_time(plan)
    timings = verl_timing_seconds(step)
    seconds = step.phase_seconds
    assert timings["gen"] == pytest.approx(seconds["rollout"] + seconds["weight_sync"])
    assert timings["update_actor"] == pytest.approx(seconds["actor_update"] + seconds["offload"])
    assert timings["ref"] == pytest.approx(seconds["ref_log_prob"])
    assert timings["step"] == pytest.approx(step.total_seconds)


def test_published_sweeps_rank_as_measured_and_most_phases_are_within_a_quarter():
    """benchmarks/data/steptime_sweeps.toml: verl runs with published per-phase seconds (accuracy.md s. 4)."""
    sweeps = _sweeps_module()
    data = sweeps.load_sweeps()
    runs = sweeps.all_runs(data)
    _, summary = sweeps.sweep_section(data, runs, DEFAULT_PROFILE)
    assert len(summary["sweeps"]) >= 3
    for name, rho in summary["sweeps"].items():
        assert rho >= 0.8, name
    assert summary["within"] > 0.75 * summary["phases"]


def test_keys_summed_over_generation_rounds_are_shown_beside_one_round_and_never_compared():
    """recipe.dapo's dynamic sampling at a generation batch of the train batch (the DAPO-14B / 32B Megatron scripts)
    sums every round into verl's `gen` and `step`: a sweep's `summed_over_rounds` keys leave the compared seconds,
    its cells say so, and the phase count and the rank correlation drop them."""
    import copy

    sweeps = _sweeps_module()
    data = sweeps.load_sweeps()
    name = "dapo-14b-h20"
    runs = [run for run in sweeps.all_runs(data) if run.sweep == name]
    _, before = sweeps.sweep_section({name: data[name]}, runs, DEFAULT_PROFILE)
    marked = copy.deepcopy(data[name])
    marked["summed_over_rounds"] = ["gen", "step"]
    marked["rounds_source"] = "a test's reason"
    summed = sweeps.all_runs({name: marked})
    for run, plain in zip(summed, runs, strict=True):
        assert set(run.over_rounds) == {"gen", "step"}
        assert not set(run.over_rounds) & set(run.measured)
        assert {**run.measured, **run.over_rounds} == plain.measured
    lines, after = sweeps.sweep_section({name: marked}, summed, DEFAULT_PROFILE)
    assert after["phases"] == before["phases"] - 2 * len(runs)
    assert name not in after["sweeps"]
    text = "\n".join(lines)
    assert text.count("(every round)") == 2 * len(runs)
    assert "a test's reason" in text and "`generate_sequences`" in text


def test_published_megatron_dapo_recipe_rows_sum_their_rounds_and_the_others_do_not():
    """Only the Megatron sweeps whose scripts run recipe.dapo with filter_groups and no data.gen_batch_size mark
    `gen` and `step` as summed over rounds; their measured `gen` is over twice their last round's engine call,
    against at most 1.35x in the FSDP rows of the same recipe, which generate 3x the train batch once."""
    sweeps = _sweeps_module()
    megatron = sweeps.load_sweeps(sweeps.MEGATRON_DATA)
    summed = {name for name, sweep in megatron.items() if sweep.get("summed_over_rounds")}
    assert summed == {"dapo-14b-h20-megatron", "dapo-32b-h20-megatron"}
    for run in sweeps.all_runs(megatron):
        if run.sweep in summed and "gen" in run.over_rounds:
            assert run.over_rounds["gen"] > 2 * run.measured["generate_sequences"], run.label
    for run in sweeps.all_runs(sweeps.load_sweeps()):
        if run.sweep == "dapo-14b-h20":
            assert run.plan.data.gen_batch_size == 3 * run.plan.data.train_batch_size
            assert run.measured["gen"] < 1.35 * run.measured["generate_sequences"], run.label


def test_megatron_rows_with_a_script_of_their_own_run_at_its_rollout_memory_utilization():
    """ISEEKYAN/verl_megatron_practice's DAPO_7B/N.*.sh and DAPO_MOE30B/N.*.sh are the tables' row N: where a row
    has its script, it is priced at that script's rollout.gpu_memory_utilization (the KV cache its engines hold)."""
    sweeps = _sweeps_module()
    own = {("dapo-7b-h100-megatron", "9"): 0.8, ("dapo-moe30b-h100-megatron", "3"): 0.8,
           ("dapo-moe30b-h100-megatron", "4"): 0.8, ("dapo-moe30b-h100-megatron", "5"): 0.8,
           ("dapo-moe30b-h100-megatron", "7"): 0.7, ("dapo-moe30b-h100-megatron", "8"): 0.5,
           ("dapo-moe30b-h100-megatron", "9"): 0.5, ("dapo-7b-h100-megatron", "16"): 0.6}
    runs = {(run.sweep, run.label.split(":")[0]): run for run in sweeps.all_runs(sweeps.load_sweeps(sweeps.MEGATRON_DATA))}
    for key, utilization in own.items():
        assert runs[key].plan.rollout.gpu_memory_utilization == pytest.approx(utilization), key


def test_rollout_tp1_generates_faster_than_tp4_for_a_7b_model_on_8_h100():
    """Published: 144 s at TP 1 against 399 s at TP 4 (dapo7b.csv rows 14 and 2): one engine's host work per
    token does not shrink with TP, and eight engines share it."""
    sweeps = _sweeps_module()
    runs = {run.label.split(":")[0]: run for run in sweeps.all_runs(sweeps.load_sweeps())
            if run.sweep == "dapo-7b-h100"}
    tp1, tp4 = (sweeps.predicted_timings(runs[row], DEFAULT_PROFILE)["gen"] for row in ("14", "2"))
    assert tp4 > 1.5 * tp1


def test_published_megatron_runs_import_as_the_megatron_layouts_they_ran():
    """benchmarks/data/steptime_sweeps_megatron.toml (accuracy.md s. 5, out of sample): each run is priced as the
    Megatron plan its overrides describe (TP, PP, VPP, CP, EP, recompute), with every phase it measured priced."""
    sweeps = _sweeps_module()
    data = sweeps.load_sweeps(sweeps.MEGATRON_DATA)
    assert not set(data) & set(sweeps.load_sweeps()), "the Megatron runs stay out of the FSDP sweeps --fit reads"
    for run in sweeps.all_runs(data):
        engine = run.plan.actor.mcore
        # The row's layout as its label spells it ("tp4pp2vpp2", "tp2cp2", "tp4ep16"), and its other switches.
        layout = next(part for part in run.label.replace(",", " ").split() if part.startswith("tp"))
        assert run.plan.is_megatron, run.label
        assert layout.startswith(f"tp{engine.tensor_model_parallel_size}"), run.label
        assert (engine.pipeline_model_parallel_size > 1) == ("pp" in layout), run.label
        assert (engine.context_parallel_size > 1) == ("cp" in layout), run.label
        assert (engine.expert_model_parallel_size > 1) == ("ep" in layout), run.label
        assert (engine.recompute_granularity == "full") == ("full recompute" in run.label), run.label
        assert engine.param_offload == ("offload" in run.label or run.sweep != "grpo-7b-h100-megatron"), run.label
        predicted = sweeps.predicted_timings(run, DEFAULT_PROFILE)
        assert all(predicted[key] > 0 for key in sweeps.SHOWN), run.label
