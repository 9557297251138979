"""The Megatron backend's per-rank memory (planner/memory/megatron.py) against Megatron-Core's own estimate.

`megatron_estimate` restates megatron/training/theoretical_memory_usage.py (NVIDIA/Megatron-LM, the
formulas of compute_weight_and_optimizer_memory and, with sequence parallelism and selective recompute,
compute_activation_memory) for the configurations both cover: no experts, RMSNorm, SwiGLU weights,
activations of an ungated MLP (the shape its activation formula assumes), DP without context parallelism.
"""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.arch import Architecture
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory.megatron import (
    export_gather_bytes,
    in_flight_micro_batches,
    layer_activation_bytes_per_token,
    parameters_on_most_loaded_rank,
    stage_activations,
    state_on_most_loaded_rank,
)
from rlplan.planner.memory.phases import at_max_length
from rlplan.planner.memory.rollout import rollout_budget, trainer_bytes_at_engine_start
from rlplan.planner.plan import MegatronSection
from rlplan.planner.presets import resolve_model

LLAMA_8B = resolve_model("llama-3.1-8b").arch  # GQA, untied, no biases or qk-norm: Megatron's weight formula
QWEN3_MOE = resolve_model("qwen3-30b-a3b").arch


def megatron_weights_and_optimizer(arch: Architecture, *, tp: int, pp: int, dp: int, distributed: bool) -> float:
    """compute_weight_and_optimizer_memory for a dense RMSNorm SwiGLU model (bytes)."""
    h = arch.hidden_size
    attention = 2 * h * h * ((1 + arch.num_kv_heads / arch.num_attention_heads)
                             * (arch.head_dim * arch.num_attention_heads / h))
    layer = 2 * h * (arch.intermediate_size * 3 / 2 + 1) + attention
    embedding = h * arch.vocab_size
    block = layer * arch.num_layers + h
    most_loaded = (block / pp + embedding) / tp
    if not arch.tie_word_embeddings and pp == 1:
        most_loaded += embedding / tp
    return most_loaded * (6 + 12 / dp if distributed else 18)


def megatron_activations(arch: Architecture, *, seq: int, micro: int, tp: int, pp: int, vpp: int | None,
                         micro_batches: int | None) -> float:
    """compute_activation_memory (sequence parallel, selective recompute), bytes, first stage."""
    h = arch.hidden_size
    memory = seq * micro * h * (18 + 4 * arch.intermediate_size / h) * arch.num_layers
    memory += 8 * seq * micro * pp + seq * micro * h * pp
    if vpp is not None:
        memory *= 1 + (pp - 1) / (pp * vpp)
    if vpp is None and pp > 1 and micro_batches is not None:
        memory *= min(1, micro_batches / pp)
    if pp == 1:
        memory += seq * micro * h * 4 * (1 + arch.vocab_size / h)
    return memory / tp


# An MHA, ungated-activation twin of a GPT-style model: Megatron's activation formula's shape.
MHA_4K = attrs.evolve(LLAMA_8B, num_kv_heads=32)


@pytest.mark.parametrize(("tp", "pp", "world", "distributed"), [
    (1, 1, 8, True), (2, 1, 8, True), (4, 2, 32, True), (8, 4, 64, False), (2, 8, 256, True)])
def test_weights_grads_and_optimizer_equal_megatron_cores_estimate(tp, pp, world, distributed):
    engine = MegatronSection(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             use_distributed_optimizer=distributed)
    ours = state_on_most_loaded_rank(LLAMA_8B, engine, world).total
    theirs = megatron_weights_and_optimizer(LLAMA_8B, tp=tp, pp=pp, dp=world // (tp * pp), distributed=distributed)
    assert ours == pytest.approx(theirs, rel=1e-9)


@pytest.mark.parametrize(("tp", "pp", "vpp", "micro_batches"), [
    (1, 1, None, 4), (2, 1, None, 1), (4, 2, None, 8), (4, 4, None, 2), (2, 4, 2, 16), (8, 2, 4, 8)])
def test_first_stage_activations_equal_megatron_cores_estimate(tp, pp, vpp, micro_batches):
    engine = MegatronSection(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             virtual_pipeline_model_parallel_size=vpp, sequence_parallel=True)
    seq, micro = 4096, 2
    ours = stage_activations(MHA_4K, engine, tokens_per_micro_batch=seq * micro, micro_batches=micro_batches,
                             gated=False, rotary_outputs=False).first
    theirs = megatron_activations(MHA_4K, seq=seq, micro=micro, tp=tp, pp=pp, vpp=vpp, micro_batches=micro_batches)
    assert ours == pytest.approx(theirs, rel=1e-9)


def test_experts_split_over_ep_and_etp_and_their_optimizer_over_the_expert_data_parallel_group():
    base = MegatronSection(tensor_model_parallel_size=1, expert_model_parallel_size=1)
    ep8 = MegatronSection(tensor_model_parallel_size=1, expert_model_parallel_size=8)
    one, eight = (parameters_on_most_loaded_rank(QWEN3_MOE, engine) for engine in (base, ep8))
    assert eight.experts == pytest.approx(one.experts / 8) and eight.dense == one.dense
    # 16 GPUs, EP 8: expert DP 2, dense DP 16
    state = state_on_most_loaded_rank(QWEN3_MOE, ep8, 16)
    assert state.optimizer == pytest.approx(12 * (eight.dense / 16 + eight.experts / 2))


def test_lora_trains_a_fraction_so_only_that_fraction_has_gradients_and_optimizer_state():
    engine = MegatronSection(tensor_model_parallel_size=2)
    full, lora = (state_on_most_loaded_rank(LLAMA_8B, engine, 8, fraction) for fraction in (1.0, 0.01))
    assert lora.weights == full.weights
    assert lora.grads == pytest.approx(full.grads / 100) and lora.optimizer == pytest.approx(full.optimizer / 100)


def test_full_recompute_keeps_layer_inputs_and_one_chunk_so_it_saves_most_of_the_stage():
    plain = MegatronSection(tensor_model_parallel_size=2)
    recompute = attrs.evolve(plain, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    kept, saved = (stage_activations(LLAMA_8B, engine, tokens_per_micro_batch=8192, micro_batches=4)
                   for engine in (plain, recompute))
    layers_only = kept.first - kept.loss_head
    assert saved.first - saved.loss_head < layers_only / 4
    assert saved.loss_head == kept.loss_head


@pytest.mark.parametrize("layers", [1, 4, 16])
def test_block_recompute_keeps_every_layer_it_does_not_checkpoint_and_uniform_one_chunk(layers):
    """Megatron-Core's _checkpointed_forward: `block` checkpoints only the first n layers of the stage (the
    rest keep their activations), `uniform` checkpoints the whole stage in chunks of n, recomputing one chunk
    at a time; so block keeps more than uniform at the same n, and both less than no recompute."""
    def layers_bytes(method: str | None) -> float:
        engine = MegatronSection(tensor_model_parallel_size=2, recompute_granularity="full" if method else None,
                                 recompute_method=method, recompute_num_layers=layers if method else None)
        return stage_activations(LLAMA_8B, engine, tokens_per_micro_batch=4096, micro_batches=1).first_layers

    per_layer = 4096 * layer_activation_bytes_per_token(LLAMA_8B, moe=False, tp=2, etp=2, sequence_parallel=True)
    layer_input = 4096 * 2 * LLAMA_8B.hidden_size / 2
    embedding = layers_bytes(None) - LLAMA_8B.num_layers * per_layer
    assert layers_bytes("block") - embedding == pytest.approx(
        layers * layer_input + (LLAMA_8B.num_layers - layers) * per_layer + per_layer)
    assert layers_bytes("uniform") - embedding == pytest.approx(
        math.ceil(LLAMA_8B.num_layers / layers) * layer_input + layers * per_layer)
    assert layers_bytes("uniform") <= layers_bytes("block") < layers_bytes(None) + per_layer


def test_micro_batches_in_flight_keep_their_checkpoints_and_one_backward_recomputes_a_chunk_at_a_time():
    """Under PP a first stage holds PP micro batches; with full recompute each keeps only its layer inputs,
    and the chunk a backward recomputes exists for one micro batch at a time, not once per micro batch."""
    engine = MegatronSection(tensor_model_parallel_size=1, pipeline_model_parallel_size=4, sequence_parallel=False,
                             recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    one, four = (stage_activations(LLAMA_8B, engine, tokens_per_micro_batch=4096, micro_batches=m).first_layers
                 for m in (1, 4))
    per_layer = 4096 * layer_activation_bytes_per_token(LLAMA_8B, moe=False, tp=1, etp=1, sequence_parallel=False)
    layer_input = 4096 * 2 * LLAMA_8B.hidden_size
    embedding = 4096 * (8 + LLAMA_8B.hidden_size)
    stage_layers = LLAMA_8B.num_layers // 4
    assert one == pytest.approx(stage_layers * layer_input + embedding + per_layer)
    assert four - one == pytest.approx(3 * (stage_layers * layer_input + embedding))


def test_context_parallel_splits_the_sequence_and_pp_moves_the_loss_head_to_the_last_stage():
    engine = MegatronSection(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    cp2 = attrs.evolve(engine, context_parallel_size=2)
    whole, halved = (stage_activations(LLAMA_8B, e, tokens_per_micro_batch=8192, micro_batches=4)
                     for e in (engine, cp2))
    assert halved.first == pytest.approx(whole.first / 2)
    assert whole.last >= whole.loss_head > 0 and whole.first > whole.last - whole.loss_head


@given(pp=st.integers(1, 16), vpp=st.one_of(st.none(), st.integers(2, 8)), micro_batches=st.integers(1, 64))
def test_in_flight_micro_batches_never_exceed_what_the_schedule_keeps(pp, vpp, micro_batches):
    """Invariant: 1F1B keeps at most PP micro batches (fewer when there are fewer); interleaving at most 2 PP."""
    engine = MegatronSection(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp)
    held = in_flight_micro_batches(engine, micro_batches)
    if vpp is None or vpp <= 1:
        assert held == min(pp, micro_batches)
    else:
        assert pp <= held < 2 * pp or math.isclose(held, pp)


def _megatron_plan(arch=QWEN3_MOE, **knobs):
    from rlplan.planner.knobs import apply_knobs
    from tests.planner.plans import make_plan

    return apply_knobs(make_plan(arch, overrides={"actor.strategy": "megatron"}), knobs)


def _update_peak_gib(plan, component: str | None = None) -> float:
    """The actor update's GPU bytes in GiB: all of them, or one component's."""
    from rlplan.planner.memory import predict_memory

    phase = predict_memory(plan).phase("actor_update")
    return sum(c.bytes for c in phase.components if component in (None, c.name)) / 2**30


def test_a_megatron_plan_is_priced_by_the_megatron_backend_and_expert_parallelism_lowers_its_update():
    from rlplan.planner.memory.backend import training_backend
    from rlplan.planner.memory.megatron import MEGATRON

    plan = _megatron_plan()
    assert training_backend(plan) is MEGATRON
    assert _update_peak_gib(_megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8})) < _update_peak_gib(plan)


def test_megatrons_cpu_optimizer_keeps_its_fraction_of_the_optimizer_state_off_the_gpu_in_the_update():
    plan = _megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8})
    offloaded = plan.evolve(actor=attrs.evolve(plan.actor, megatron=attrs.evolve(
        plan.actor.mcore, optimizer_cpu_offload=True, optimizer_offload_fraction=1.0)))
    state = state_on_most_loaded_rank(plan.model.arch, plan.actor.mcore, plan.cluster.world_size)
    assert _update_peak_gib(plan, "actor_optimizer_state") == pytest.approx(state.optimizer / 2**30, rel=1e-3)
    assert _update_peak_gib(offloaded, "actor_optimizer_state") == 0
    assert _update_peak_gib(offloaded) < _update_peak_gib(plan)


@pytest.mark.parametrize("knobs", [{"actor.megatron.expert_model_parallel_size": 8},
                                   {"actor.megatron.use_distributed_optimizer": False}])
def test_verls_megatron_step_on_a_gpu_is_the_fused_adam_with_no_temporaries_and_torchs_foreach_adamw_its_sqrt_buffer(
        knobs):
    """verl's Megatron models need Transformer Engine, so Megatron-Core steps TE's FusedAdam, in place: the update's
    optimizer step holds the state and nothing beside it. torch's foreach AdamW (what the CPU twin runs, priced by
    benchmarks/megatron_twin.py with foreach=True) holds fp32 sqrt(exp_avg_sq) of the larger optimizer group."""
    from rlplan.planner.memory.megatron import MEGATRON, optimizer_step_bytes
    from rlplan.planner.profile import DEFAULT_PROFILE

    plan = _megatron_plan(**knobs)
    state = MEGATRON.role_state(plan, "actor", plan_layout(plan))
    assert state.optimizer_step == 0
    moments = dict(MEGATRON.update_moments(plan, "actor", state, _update_role(plan), None, DEFAULT_PROFILE))
    step = {c.name: c.bytes for c in moments["optimizer_step"]}
    assert step["optimizer_step_temporaries"] == 0
    assert sum(step.values()) == int(state.params) + int(state.grads) + int(state.optimizer)
    rank = state_on_most_loaded_rank(plan.model.arch, plan.actor.mcore, plan.cluster.world_size)
    assert optimizer_step_bytes(rank.largest_optimizer, foreach=True) == pytest.approx(rank.largest_optimizer / 3)
    assert optimizer_step_bytes(rank.largest_optimizer, foreach=False) == 0


def test_megatron_leaves_its_grad_buffer_and_main_weights_on_the_gpu_when_the_engine_starts_unless_offloaded():
    """Megatron-Core allocates the DDP grad buffer with the model and the distributed optimizer's fp32 main weights
    with the optimizer, before verl builds the rollout engine; param_offload takes the weights and the buffer off,
    optimizer_offload the main weights. FSDP has neither before its first step: its parameters alone."""
    from rlplan.planner.memory.fsdp import FSDP
    from rlplan.planner.memory.megatron import MAIN_WEIGHT_SHARE_OF_ADAM, MEGATRON
    from tests.planner.plans import make_plan

    def at_start(plan, backend) -> float:
        state = backend.role_state(plan, "actor", plan_layout(plan))
        return backend.resident_at_engine_start(plan, "actor", backend.state_on_gpu(plan, "actor", state))

    plan = _megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8})
    state = MEGATRON.state_on_gpu(plan, "actor", MEGATRON.role_state(plan, "actor", plan_layout(plan)))
    assert state.grads > 0
    assert at_start(plan, MEGATRON) == int(state.params + state.grads + MAIN_WEIGHT_SHARE_OF_ADAM * state.optimizer)
    assert at_start(plan.evolve(actor=attrs.evolve(plan.actor, megatron=attrs.evolve(
        plan.actor.mcore, param_offload=True, optimizer_offload=True))), MEGATRON) == 0
    fsdp = make_plan(QWEN3_MOE)
    assert at_start(fsdp, FSDP) == int(FSDP.state_on_gpu(fsdp, "actor", FSDP.role_state(fsdp, "actor", plan_layout(
        fsdp))).params)


def test_verls_megatron_lora_example_fits_on_the_h100s_it_names_and_the_dense_example_too():
    """verl's run_qwen3moe-30b_megatron_lora.sh (8 GPUs, TP 2 PP 2 CP 2 EP 4, full recompute, everything
    offloaded) and run_qwen2-7b_math_megatron.sh (8 GPUs, TP 2 PP 2) price under an 80 GB GPU."""
    from pathlib import Path

    from rlplan.planner.memory import predict_memory
    from rlplan.planner.presets import resolve_gpu
    from rlplan.planner.verl_import import import_verl_script

    scripts = Path(__file__).resolve().parents[1] / "data" / "verl_scripts"
    for name in ("megatron_moe_lora_qwen3_30b_a3b.sh", "megatron_dense_qwen2_7b.sh"):
        plan = import_verl_script((scripts / name).read_text(), gpu=resolve_gpu("h100-80g"), host_memory_gib=2048.0,
                                  env={"HOME": "/h"}, local_config_reader=lambda path: None).plan
        assert predict_memory(plan).gpu_peak_bytes < plan.cluster.gpu.memory_gib * 2**30, name


def test_a_qwen3_moe_layer_saves_what_megatrons_code_saves_and_verl_saves_no_dropout_masks():
    """Per token, a Qwen3-30B-A3B layer at TP 1 / ETP 1: 8 routed copies x (grouped fc1's saved input 2 h,
    the fc1 output weighted SwiGLU saves 4 f, fc2's saved input 2 f), attention (QKV out, core output, the rotary
    Q and K, and under QK norm the query's copy), the norms' and linears' inputs (8 h) and fp32 router scores;
    verl's hidden_dropout 0 saves no masks (2 h)."""
    h, f = QWEN3_MOE.hidden_size, QWEN3_MOE.moe_intermediate_size
    verl = layer_activation_bytes_per_token(QWEN3_MOE, moe=True, tp=1, etp=1, sequence_parallel=False,
                                            dropout_masks=False)
    q, kv = QWEN3_MOE.q_width, QWEN3_MOE.kv_width
    # QKV output and core output, the rotary Q and K core attention saves, then the QK norms' query copy
    attention = 2 * (q + 2 * kv) + 2 * q + 2 * (q + kv) + 2 * q
    assert verl == 8 * (2 * h + 4 * f + 2 * f) + attention + 8 * h + 4 * QWEN3_MOE.num_experts == 122_368
    with_masks = layer_activation_bytes_per_token(QWEN3_MOE, moe=True, tp=1, etp=1, sequence_parallel=False)
    assert with_masks - verl == 2 * h
    no_qk_norm = layer_activation_bytes_per_token(attrs.evolve(QWEN3_MOE, qk_norm=False), moe=True, tp=1, etp=1,
                                                  sequence_parallel=False, dropout_masks=False)
    assert verl - no_qk_norm == 2 * q  # rotary's Q and K are new tensors with or without the QK norms


@pytest.mark.parametrize("tp, etp", [(4, 1), (2, 2), (4, 4)])
def test_the_moe_block_holds_the_ranks_sequence_parallel_shard_and_the_expert_tp_gather(tp, etp):
    """Megatron-Core's token dispatchers take the sequence-parallel shard [S/TP, B, H] (token_dispatcher.py:
    num_local_tokens = S/TP*B; alltoall: permute -> A2A over EP -> all-gather over the expert-TP group). Per
    token of the micro batch a rank saves k / TP x ETP full-width copies and their fc1 / activation outputs at
    1 / ETP width; the router's fp32 scores are per shard token. Isolated as the difference of two top-k."""
    def routed(k: int, tp: int, etp: int) -> float:
        arch = attrs.evolve(QWEN3_MOE, num_experts_per_token=k)
        return layer_activation_bytes_per_token(arch, moe=True, tp=tp, etp=etp, sequence_parallel=True,
                                                dropout_masks=False)

    h, f = QWEN3_MOE.hidden_size, QWEN3_MOE.moe_intermediate_size
    four_copies = routed(8, tp, etp) - routed(4, tp, etp)
    assert four_copies == pytest.approx(4 * (2 * h * etp + 4 * f + 2 * f) / tp)
    assert four_copies < routed(8, 1, 1) - routed(4, 1, 1)


def test_verls_published_megatron_runs_are_priced_as_they_ended():
    """benchmarks/data/steptime_sweeps_megatron.toml: published runs with measured step times (so each ran
    without running out of memory on its GPUs at the lengths its rollouts drew) and runs the table marks out of
    memory. Built as benchmarks/steptime_sweeps.py builds them (their sweep's verl release, the run's derived mean
    lengths), every run that ran fits and every run that died does not, but for the known misses
    (benchmarks/megatron_memory.py KNOWN_MISSES, each with its reason), which must still be misses. Their verl
    balanced ceil(tokens / budget) micro batches and capped none: priced one mean sequence over the budget, above
    the largest micro batch verl's Karmarkar-Karp partition makes of the run's lengths (the model errs high)."""
    import tomllib

    from tests.repo_scripts import load_script

    benchmark = load_script("benchmarks/megatron_memory.py")
    runs = benchmark.published_runs()
    published = tomllib.loads(benchmark.MEGATRON_DATA.read_text(encoding="utf-8"))["sweep"]
    assert len(runs) == sum(len(sweep["run"]) for sweep in published)
    assert sum(run.died for run in runs) == 4 and len(runs) - 4 == 29
    wrong = {run.label: (run.died, round(run.report.gpu_peak_bytes / 2**30, 1)) for run in runs
             if not run.verdict_right}
    assert set(wrong) == set(benchmark.KNOWN_MISSES), wrong
    for run in runs:
        assert run.plan.data.expected_response_length is not None  # priced at the run's mean lengths
        assert run.plan.stack.verl == "0.5.0"
        partition = benchmark.partition_at_run_lengths(run.plan)
        priced = plan_layout(run.plan).actor_update.tokens_per_micro_batch
        assert partition is None or partition <= priced, run.label


def test_vllm_0_9_1_would_refuse_to_start_the_nv_rows_that_died_at_tp2_and_none_of_the_runs_that_ran():
    """vLLM from 0.9.1 refuses to start below util x GPU free (memory/rollout.py free_at_engine_start). The NV GRPO
    rows at TP 2 CP 1-2 without offload keep ~32 GiB of Megatron state (weights, fp32 grad buffer, main weights, the
    reference's weights) on the GPU when verl builds the engine: row 4 (util 0.8) and rows 10-11 (util 0.6) would not
    start, row 5 (util 0.5) would and runs out of memory later; no run that ran would be refused. At the sweep's own
    release (verl 0.5.0, vLLM 0.8.5) there is no such check, and row 4 stays the known miss."""
    from tests.repo_scripts import load_script

    benchmark = load_script("benchmarks/megatron_memory.py")
    runs = benchmark.published_runs()
    at_091 = {run.label.partition(":")[0]: (run, rollout_budget(run.plan.evolve(
        stack=attrs.evolve(run.plan.stack, vllm="0.9.1")))) for run in runs}
    refused = {label for label, (_, budget) in at_091.items() if not budget.starts}
    assert refused == {"Qwen2.5-7B-Instruct row 4", "Qwen2.5-7B-Instruct row 10", "Qwen2.5-7B-Instruct row 11"}
    assert all(run.died for run, budget in at_091.values() if not budget.starts)
    row4, budget = at_091["Qwen2.5-7B-Instruct row 4"]
    assert trainer_bytes_at_engine_start(row4.plan) / 2**30 == pytest.approx(31.9, abs=0.05)
    assert budget.free_at_start_bytes is not None and budget.free_at_start_bytes < budget.requested_bytes
    assert all(rollout_budget(run.plan).free_at_start_bytes is None for run in runs)  # vLLM 0.8.5: no check
    assert row4.report.fits and row4.report.rollout.starts


def test_the_published_megatron_runs_tail_is_priced_at_the_worst_mix_of_lengths():
    """At the maximum lengths the soft budget is priced one max-length sequence over (the bound of a balanced
    partition's largest group): the tail is never below the run's own verdict, and the 7B TP 2 row (10,240-token
    budget, 8,192-token responses allowed) does not fit there: a step whose lengths mix that badly could run out
    of memory, which the published run, its responses ~1,500 tokens on average, did not meet."""
    from tests.repo_scripts import load_script

    runs = load_script("benchmarks/megatron_memory.py").published_runs()
    assert all(run.tail.gpu_peak_bytes >= run.report.gpu_peak_bytes for run in runs)
    row16 = next(run for run in runs if run.label.startswith("Qwen2.5-Math-7B row 16:"))
    assert row16.report.fits_gpu and not row16.tail.fits_gpu
    tail = plan_layout(at_max_length(row16.plan)).actor_update
    assert tail.tokens_per_micro_batch == tail.max_token_len_per_gpu + tail.max_sequence_length


def test_largest_differencing_partition_balances_as_verl_does():
    """The benchmark's Karmarkar-Karp: equal lengths split exactly, the totals are kept, the spread of a
    balanced partition stays under its longest item, and it is the differencing method, not an optimal split."""
    from tests.repo_scripts import load_script

    partition = load_script("benchmarks/megatron_memory.py").largest_differencing_partition
    assert sorted(partition([10_240] * 8, 4)) == [20_480] * 4
    assert sorted(partition([8, 7, 6, 5, 4], 2)) == [14, 16]  # differencing's textbook miss: 15 / 15 exists
    groups = partition([5_000, 4_000, 3_000, 2_000, 1_500, 900, 700, 300], 3)
    assert sum(groups) == 17_400 and max(groups) - min(groups) < 5_000


def _moe_full_example(nodes: int):
    from pathlib import Path

    from rlplan.planner.presets import resolve_gpu
    from rlplan.planner.verl_import import import_verl_script

    script = Path(__file__).resolve().parents[1] / "data" / "verl_scripts" / "megatron_moe_qwen3_30b_a3b.sh"
    return import_verl_script(script.read_text(), gpu=resolve_gpu("h20-96g"), host_memory_gib=2048.0,
                              env={"HOME": "/h", "TEST_FILE": "/t.parquet", "NNODES": str(nodes)},
                              local_config_reader=lambda path: None).plan


def test_verls_moe_full_example_prices_the_same_update_on_one_node_as_on_four():
    """EP stays 8, the token budget is per GPU and the optimizer lives on the host: more nodes (the script
    says 1 to 4) lower no term of a rank's update; the fp32 grad buffer (verl's grad_reduce_in_fp32) is there."""
    one, four = _moe_full_example(1), _moe_full_example(4)
    assert four.cluster.world_size == 4 * one.cluster.world_size
    assert _update_peak_gib(four) == pytest.approx(_update_peak_gib(one), rel=1e-3)
    params = parameters_on_most_loaded_rank(one.model.arch, one.actor.mcore).total
    assert _update_peak_gib(one, "actor_grads") == pytest.approx(4 * params / 2**30, rel=1e-3)
    assert _update_peak_gib(one, "actor_optimizer_state") == 0



@pytest.mark.parametrize("pp", [1, 2])
def test_the_update_holds_the_loss_head_or_a_layers_backward_workspace_never_both(pp):
    """Autograd frees every logits-sized buffer of the head's backward before the last layer's backward starts:
    the update's peak is the larger of (last stage's layers + head) and (most loaded stage's layers + one
    layer's workspace), not their sum."""
    from rlplan.planner.memory.heads import update_loss_head
    from rlplan.planner.profile import DEFAULT_PROFILE

    plan = _megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8,
                             "actor.megatron.pipeline_model_parallel_size": pp})
    engine, arch = plan.actor.mcore, plan.model.arch
    names = {c.name for c in _update_components(plan)}
    assert len(names & {"logits_head", "layer_backward_workspace"}) == 1
    role = _update_role(plan)
    stages = stage_activations(arch, engine, tokens_per_micro_batch=role.tokens_per_micro_batch,
                               micro_batches=role.micro_batches_per_mini, dropout_masks=False)
    head = max(update_loss_head(plan, DEFAULT_PROFILE, role.tokens_per_micro_batch).bytes_per_token_vocab
               * role.tokens_per_micro_batch * arch.vocab_size, stages.loss_head)
    workspace = role.tokens_per_micro_batch * layer_activation_bytes_per_token(
        arch, moe=True, tp=1, etp=1, sequence_parallel=False, dropout_masks=False)
    activations_side = sum(c.bytes for c in _update_components(plan)
                           if c.name in ("activations", "logits_head", "layer_backward_workspace"))
    expected = max(stages.last_layers + head, stages.layers_peak + workspace)
    assert activations_side == pytest.approx(expected, rel=1e-6)
    assert activations_side < stages.peak + max(0.0, head - stages.loss_head) + workspace


def test_a_megatron_critic_holds_a_value_head_not_the_output_layer():
    """verl's make_value_model swaps the last stage's output layer (vocab x hidden) for hidden -> 1."""
    arch, engine = LLAMA_8B, MegatronSection(tensor_model_parallel_size=2)
    actor = parameters_on_most_loaded_rank(arch, engine)
    critic = parameters_on_most_loaded_rank(arch, engine, value_model=True)
    assert actor.total - critic.total == pytest.approx((arch.lm_head_params - arch.hidden_size) / 2)
    at_pp2 = MegatronSection(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert parameters_on_most_loaded_rank(arch, at_pp2, value_model=True) == parameters_on_most_loaded_rank(
        arch, at_pp2)  # the first stage, with the embedding, is the most loaded one either way


def test_a_megatron_critics_update_prices_a_value_head_not_the_vocabulary():
    """verl's make_value_model swaps the output layer for hidden -> 1: the critic's update holds no logits."""
    from rlplan.planner.memory import predict_memory

    plan = _megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8, "algorithm.adv_estimator": "gae"})
    critic = predict_memory(plan).phase("critic_update")
    actor = predict_memory(plan).phase("actor_update")
    tokens = _update_role(plan).tokens_per_micro_batch
    logits = tokens * 4 * plan.model.arch.vocab_size
    assert critic.bytes_of("logits_head") < logits / 100
    assert actor.bytes_of("logits_head") + actor.bytes_of("activations") > critic.bytes_of("activations") + logits


def _update_role(plan):
    from rlplan.planner.layout import plan_layout

    return plan_layout(plan).actor_update


def _update_components(plan):
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.memory.heads import update_loss_head
    from rlplan.planner.memory.megatron import MEGATRON
    from rlplan.planner.profile import DEFAULT_PROFILE

    role = _update_role(plan)
    state = MEGATRON.role_state(plan, "actor", plan_layout(plan))
    _, components = MEGATRON.update_components(plan, "actor", state, role,
                                               update_loss_head(plan, DEFAULT_PROFILE, role.tokens_per_micro_batch),
                                               DEFAULT_PROFILE)
    return components


def _host(plan) -> dict[str, int]:
    from rlplan.planner.memory import predict_memory

    return {c.name: c.bytes for c in predict_memory(plan).host.components}


def test_verls_megatron_offload_keeps_params_and_optimizer_on_the_host_but_never_gradients():
    """offload_megatron_model_to_cpu copies param_data to pinned host memory and only frees grad_data (load
    re-allocates and zeroes it): the host holds every rank's bf16 params, no grads; the CPU optimizer's
    optimizer state sits on the host whether or not optimizer_offload is set."""
    plan = _moe_full_example(1)
    host = _host(plan)
    state = state_on_most_loaded_rank(plan.model.arch, plan.actor.mcore, plan.cluster.world_size)
    ranks = plan.cluster.gpus_per_node
    assert host["actor_params_offloaded"] == pytest.approx(ranks * state.weights, rel=1e-6)
    assert "actor_grads_offloaded" not in host
    assert host["actor_optimizer_offloaded"] == pytest.approx(ranks * state.optimizer, rel=1e-6)
    kept_by_cpu_optimizer = plan.evolve(actor=attrs.evolve(
        plan.actor, megatron=attrs.evolve(plan.actor.mcore, optimizer_offload=False)))
    assert _host(kept_by_cpu_optimizer)["actor_optimizer_offloaded"] == host["actor_optimizer_offloaded"]

# --- the weight sync's export (verl's per_tensor_generator / mbridge export_weights) ---------------------


def test_a_dense_export_holds_two_full_copies_of_its_largest_tensor_and_the_broadcast_shard():
    engine = MegatronSection(tensor_model_parallel_size=4)
    embedding = LLAMA_8B.vocab_size * LLAMA_8B.hidden_size  # Llama's largest tensor: 128256 x 4096
    assert export_gather_bytes(LLAMA_8B, engine) == pytest.approx(2 * embedding * (2 + 1 / 4))


@given(ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]))
def test_an_expert_export_grows_with_ep_and_never_prices_the_3d_all_experts_tensor(ep):
    """Invariant: the EP all-gather holds EP expert shards at once, so the export grows with EP; one expert
    at a time stays under what the FSDP formula priced, the fp32 + bf16 copies of transformers' fused tensor
    of all 128 experts."""
    bigger = MegatronSection(expert_model_parallel_size=min(ep * 2, 128), expert_tensor_parallel_size=1)
    engine = MegatronSection(expert_model_parallel_size=ep, expert_tensor_parallel_size=1)
    assert export_gather_bytes(QWEN3_MOE, engine) <= export_gather_bytes(QWEN3_MOE, bigger)
    all_experts = QWEN3_MOE.num_experts * 2 * QWEN3_MOE.moe_intermediate_size * QWEN3_MOE.hidden_size
    assert export_gather_bytes(QWEN3_MOE, engine) < (4 + 2) * all_experts


def test_an_unmerged_bridge_adapter_syncs_only_its_adapter():
    from rlplan.planner.memory.megatron import MEGATRON
    from tests.planner.plans import make_plan

    overrides = {"actor.strategy": "megatron", "model.lora.rank": 32, "model.lora.alpha": 64,
                 "model.lora.target_modules": ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")}
    adapter = make_plan(gpus=8, overrides={**overrides, "rollout.load_format": "safetensors"})
    first_sync = make_plan(gpus=8, overrides={**overrides, "rollout.load_format": "dummy"})
    bucket = 512 * 2**20
    assert MEGATRON.weight_sync_gather_bytes(adapter, bucket) < MEGATRON.weight_sync_gather_bytes(first_sync, bucket)


def _twin_rows():
    from tests.repo_scripts import load_script

    twin = load_script("benchmarks/megatron_twin.py")
    return twin, twin.all_moments(twin.load())


def test_every_term_is_held_to_megatron_cores_measured_step_moment_by_moment():
    """benchmarks/data/megatron_twin.json: Megatron-Core's GPTModel, DDP grad buffer and optimizer measured on
    the CPU (runtime/megatron_twin.py), net of the fixed buffers a tiny model magnifies (the benchmark's
    `fixed`). The state is its weights, grad buffer, main params and moments within 1 %
    (summed from Megatron's DDP buffers and optimizer);
    the update's peak never under by more than 5 % (a pipeline stage's point-to-point tensors in flight are not
    priced: -3.5 % at PP 2 here) and the optimizer's step by more than 3 %, neither over by more than 10 %
    (the CUDA allocator, which the twin leaves out, is the profile's reserve); verl's no-grad log-prob pass
    (Megatron-Core's cross entropy beside the logits, and their clone with the entropy) never under by more
    than 3 %."""
    _, rows = _twin_rows()
    assert rows, "no cached twin measurement matches the benchmark's cases"
    for row in rows:
        moments = [("state", -0.01, 0.01), ("update", -0.05, 0.10), ("optimizer", -0.03, 0.10)]
        if row.case.log_prob:  # verl's no-grad log-prob pass: the weights and the larger of the layers and the head
            moments.append(("log_prob", -0.03, 0.10))
        for moment, low, high in moments:
            error = row.predicted[moment] / row.measured[moment] - 1
            assert low <= error <= high, (row.case.label, moment, error)
        if row.case.offload:  # verl's offload leaves nothing of the state on the GPU; its reload all of it, once
            assert abs(row.measured["offloaded"]) <= 0.01 * row.measured["state"]
            assert row.measured["reload"] == pytest.approx(row.predicted["reload"], rel=0.01)


def test_the_megatron_error_band_rows_are_the_twins_rows_as_the_benchmark_writes_them():
    """presets/measured_accuracy.toml's Megatron rows come from benchmarks/megatron_twin.py --write, not by hand."""
    from rlplan.planner.model_error import accuracy_rows

    twin, rows = _twin_rows()
    written = sorted((row.phase, row.configuration, row.measured_mib, row.predicted_mib)
                     for row in accuracy_rows() if row.strategy == "megatron")
    assert written == sorted((row["phase"], row["configuration"], row["measured_mib"], row["predicted_mib"])
                             for row in twin.data_rows(rows))


@pytest.mark.parametrize("verl, entropy, per_token_vocab", [
    ("0.9.1", True, 8), ("0.6.0", True, 8), ("0.5.0", True, 6), ("0.9.1", False, 6), ("0.5.0", False, 6)])
def test_a_megatron_log_prob_pass_holds_megatrons_cross_entropy_and_from_verl_0_6_the_logits_clone_for_the_entropy(
        verl, entropy, per_token_vocab):
    """verl's unfused Megatron log-prob: the bf16 vocabulary-parallel logits beside Megatron-Core's fp32 copy of
    them (6 bytes a token x vocab over TP), and from verl 0.6.0 the clone verl makes to compute the entropy
    first (2 more); the reference pass computes no entropy."""
    from rlplan.planner.memory.megatron import MEGATRON
    from rlplan.planner.stack import StackSection

    plan = _megatron_plan(**{"actor.megatron.tensor_model_parallel_size": 4})
    plan = plan.evolve(stack=StackSection(verl=verl))
    tokens, vocab = 8192, QWEN3_MOE.vocab_size
    _, head = MEGATRON.forward_components(plan, params_bytes=0, params_name="actor_params", tokens=tokens,
                                          head_bytes_per_token_vocab=2.0, entropy=entropy)
    assert head.name == "logits_head"
    assert head.bytes == int(per_token_vocab * tokens * vocab / 4)


def test_a_megatron_forward_prices_verls_head_where_it_holds_more_and_no_logits_without_a_vocabulary_head():
    """A verl head coefficient above Megatron's cross entropy prices; the fused kernels and the critic's value
    head (head coefficient 0) make no logits: the layers' transients alone."""
    from rlplan.planner.memory.megatron import forward_pass_bytes

    tokens, vocab = 8192, QWEN3_MOE.vocab_size
    _, above = forward_pass_bytes(QWEN3_MOE, tp=4, tokens=tokens, head_bytes_per_token_vocab=10.0,
                                  vocab_parallel_head=True, logits_cloned=True)
    assert above == 10 * tokens * vocab / 4
    layers, none = forward_pass_bytes(QWEN3_MOE, tp=4, tokens=tokens, head_bytes_per_token_vocab=0.0,
                                      vocab_parallel_head=False, logits_cloned=True)
    assert none == 0 < layers


# --- multi-token prediction (verl's model.mtp on the Megatron workers) -------------------------------------------

MIMO = resolve_model("mimo-7b").arch


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_mtp_layers_sit_on_the_last_stage_with_both_vocabulary_layers(pp):
    engine = MegatronSection(tensor_model_parallel_size=2, pipeline_model_parallel_size=pp)
    dense = parameters_on_most_loaded_rank(MIMO, engine)
    with_mtp = parameters_on_most_loaded_rank(MIMO, engine, mtp_layers=2)
    # At PP 1 the one stage holds both vocabulary layers already; from PP 2 the last gets the embedding too.
    embedding_copy = 0 if pp == 1 else MIMO.embedding_params
    assert with_mtp.total - dense.total == pytest.approx((2 * MIMO.mtp_layer_params + embedding_copy) / 2)
    state = state_on_most_loaded_rank(MIMO, engine, 16, mtp_layers=2)
    assert state.grads == 4 * with_mtp.total  # fp32 gradients of every MTP parameter, trained or not


def _mimo_plan(**knobs):
    from rlplan.planner.plan import MtpSection

    plan = _megatron_plan(MIMO, **{"actor.megatron.tensor_model_parallel_size": 2,
                                   "actor.megatron.pipeline_model_parallel_size": 2, **knobs})
    return plan, plan.evolve(model=attrs.evolve(plan.model, mtp=MtpSection(train=True)))


def test_trained_mtp_depths_hold_their_layers_and_cross_entropy_at_the_update_loss_and_cost_time():
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.memory.megatron import MTP_LOSS_BYTES_PER_TOKEN_VOCAB
    from rlplan.planner.steptime import predict_step_time

    dense, mtp = _mimo_plan()
    assert _update_peak_gib(dense, "mtp_activations") == 0
    held = _update_peak_gib(mtp, "mtp_activations") * 2**30
    tokens = plan_layout(mtp).actor_update.tokens_per_micro_batch
    assert held > 2 * tokens * MTP_LOSS_BYTES_PER_TOKEN_VOCAB * MIMO.vocab_size / 2  # two depths' softmax over TP 2
    assert _update_peak_gib(mtp, "actor_params") > _update_peak_gib(dense, "actor_params")
    loaded = attrs.evolve(mtp.model.mtp, train=False)
    untrained = mtp.evolve(model=attrs.evolve(mtp.model, mtp=loaded))
    assert _update_peak_gib(untrained, "mtp_activations") == 0
    assert _update_peak_gib(untrained, "actor_params") == _update_peak_gib(mtp, "actor_params")
    # Long responses, so the update is compute-bound (small micro batches are bound by their launches).
    dense, mtp = _mimo_plan(**{"data.max_response_length": 8192, "data.train_batch_size": 256})
    untrained = mtp.evolve(model=attrs.evolve(mtp.model, mtp=loaded))
    seconds = {name: predict_step_time(p, predict_memory(p)).phase_seconds["actor_update"]
               for name, p in (("dense", dense), ("untrained", untrained), ("mtp", mtp))}
    assert seconds["dense"] < seconds["mtp"] and seconds["untrained"] < seconds["mtp"]


def test_mtp_is_refused_where_verl_cannot_run_it_or_rlplan_cannot_price_it():
    from rlplan.planner.errors import PlanError
    from rlplan.planner.plan import MtpSection
    from tests.planner.plans import make_plan

    dense, mtp = _mimo_plan()
    with pytest.raises(PlanError, match="NotImplementedError") as fsdp:
        make_plan(MIMO).evolve(model=attrs.evolve(make_plan(MIMO).model, mtp=MtpSection()))
    assert fsdp.value.field == "model.mtp"
    with pytest.raises(PlanError) as speculative:
        dense.evolve(model=attrs.evolve(dense.model, mtp=MtpSection(rollout=True)))
    assert speculative.value.field == "model.mtp.rollout"
    no_layers = _megatron_plan(LLAMA_8B)
    with pytest.raises(PlanError, match="num_nextn_predict_layers"):
        no_layers.evolve(model=attrs.evolve(no_layers.model, mtp=MtpSection(train=True)))


def _dense_megatron_plan(**knobs):
    """Qwen2.5-7B under Megatron at TP 2 on verl 0.5 (fixed segments unless PYTORCH_CUDA_ALLOC_CONF says otherwise),
    dynamic micro batches of varying length."""
    from rlplan.planner.stack import StackSection

    plan = _megatron_plan(resolve_model("qwen2.5-7b").arch, **{
        "actor.megatron.tensor_model_parallel_size": 2, "actor.use_dynamic_bsz": True,
        "actor.ppo_max_token_len_per_gpu": 8192, "data.expected_response_length": 600, **knobs})
    return plan.evolve(stack=StackSection(verl="0.5.0"))


def test_the_megatron_allocator_reserve_is_the_replays_stranded_bytes_not_a_share_of_the_trainer():
    from rlplan.planner.memory.allocator_trace import stranded_bytes
    from rlplan.planner.memory.phases import step_context
    from rlplan.planner.profile import DEFAULT_PROFILE

    ctx, report = step_context(_dense_megatron_plan(), DEFAULT_PROFILE)
    for phase in report.phases:
        assert phase.bytes_of("fragmentation_reserve") == stranded_bytes(ctx, phase)
    # The rollout strands nothing of the trainer's (the flat reserve kept 8 % of the resident state there); the
    # update on fixed segments strands some of its micro batches' segments.
    assert report.phase("rollout").bytes_of("fragmentation_reserve") == 0
    assert report.phase("actor_update").bytes_of("fragmentation_reserve") > 0


def test_expandable_segments_lower_the_megatron_reserve_and_the_replays_cache():
    from rlplan.planner.memory.allocator_report import allocator_report

    fixed = _dense_megatron_plan()
    expandable = _dense_megatron_plan(**{"trainer.pytorch_cuda_alloc_conf": "expandable_segments:True"})

    def update(plan):
        reserve = predict_memory_phase(plan).bytes_of("fragmentation_reserve")
        row = next(row for row in allocator_report(plan) if row.phase == "actor_update")
        return reserve, row.reserved - row.allocated

    (fixed_reserve, fixed_cache), (expandable_reserve, expandable_cache) = update(fixed), update(expandable)
    assert expandable_reserve < fixed_reserve
    assert expandable_cache < fixed_cache


def predict_memory_phase(plan, phase: str = "actor_update"):
    from rlplan.planner.memory import predict_memory

    return predict_memory(plan).phase(phase)


def test_megatrons_grad_and_param_buffers_are_single_allocations_and_its_activations_one_per_layer_in_flight():
    from rlplan.planner.memory.megatron import MEGATRON

    plan = _dense_megatron_plan(**{"actor.megatron.pipeline_model_parallel_size": 2})
    role = _update_role(plan)
    shape = MEGATRON.allocation_shape(plan, "actor", role)
    assert shape.grad_buffers == shape.param_buffers == 1  # dense: one DDP buffer each, one model chunk
    held = math.ceil(in_flight_micro_batches(plan.actor.mcore, role.micro_batches_per_mini))
    layers = plan.actor.mcore.most_loaded_stage_layers(plan.model.arch.num_layers)
    assert shape.activation_tensors == held * layers
    # The loss moment is the last stage's, which holds one micro batch: tensors of the same shape, fewer of them.
    assert shape.activation_tensors_in("loss") == layers and shape.activation_tensors_in("backward") == held * layers
    assert shape.vocab_shards == 2 and shape.empties_cache_after_pass
    assert not MEGATRON.allocation_shape(plan, "critic", role).empties_cache_after_pass
    moe = _megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8})
    assert MEGATRON.allocation_shape(moe, "actor", _update_role(moe)).grad_buffers == 2  # dense and expert buffers


@given(budget=st.integers(2048, 20000), more=st.integers(1, 8000))
def test_a_larger_megatron_micro_batch_never_lowers_the_updates_reserve_or_its_fit(budget, more):
    """The solver bisects token budgets: the update's allocator reserve (and so its fitted figure) must not fall
    when the micro batch grows."""
    small = predict_memory_phase(_dense_megatron_plan(**{"actor.ppo_max_token_len_per_gpu": budget}))
    large = predict_memory_phase(_dense_megatron_plan(**{"actor.ppo_max_token_len_per_gpu": budget + more}))
    assert large.bytes_of("fragmentation_reserve") >= small.bytes_of("fragmentation_reserve")
    assert large.peak_bytes >= small.peak_bytes


def test_the_legacy_hybrid_engine_holds_the_other_pipeline_stages_at_the_engine_start():
    """verl before 0.4.0 loads every pipeline stage's bf16 weights onto each GPU to build vLLM (AllGatherPPModel):
    the trainer's state at the engine's start is the v0.4.0 one plus those weights (about the stages the rank does
    not train: half the TP shard at PP 2), and nothing at PP 1. The public Qwen2-7B TP 4 x PP 2 log
    (docs/accuracy.md 4c) was priced 13 % low without them."""
    from rlplan.planner.memory.megatron import MEGATRON, other_stages_weight_bytes
    from rlplan.planner.memory.model_facts import model_facts
    from rlplan.planner.stack import StackSection
    from tests.planner.plans import QWEN25_7B

    def at(verl: str, pp: int):
        plan = _megatron_plan(QWEN25_7B, **{"actor.megatron.tensor_model_parallel_size": 4,
                                            "actor.megatron.pipeline_model_parallel_size": pp})
        return attrs.evolve(plan, stack=StackSection(verl=verl))

    legacy, current = at("0.3.0.post1", 2), at("0.4.0", 2)
    extra = other_stages_weight_bytes(legacy)
    assert other_stages_weight_bytes(current) == 0 and other_stages_weight_bytes(at("0.3.0.post1", 1)) == 0
    shard = 2 * model_facts(legacy.model.arch).params / 4
    assert 0.4 * shard < extra < 0.6 * shard
    # The actor's part (a v0.3 plan also builds a reference where v0.4 may not: stack.REFERENCE_ALWAYS_RUNS).
    def actor_at_start(plan):
        state = MEGATRON.state_on_gpu(plan, "actor", MEGATRON.role_state(plan, "actor", plan_layout(plan)))
        return MEGATRON.resident_at_engine_start(plan, "actor", state)

    assert actor_at_start(legacy) == actor_at_start(current) + extra
    # The weight sync loads and broadcasts them again (the sharding manager's __enter__), held through generation.
    bucket = 512 * 2**20
    assert (MEGATRON.weight_sync_gather_bytes(legacy, bucket)
            == MEGATRON.weight_sync_gather_bytes(current, bucket) + extra)
    assert trainer_bytes_at_engine_start(legacy) >= trainer_bytes_at_engine_start(current) + extra
