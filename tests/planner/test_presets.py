"""Built-in model and GPU presets and their resolver (planner/presets.py, presets/*.toml)."""

from __future__ import annotations

import tomllib
from decimal import Decimal
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import GpuSpec
from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.presets import (
    custom_gpu,
    defaulted_speeds,
    gpu_presets,
    model_presets,
    parse_gpu_memory,
    resolve_gpu,
    resolve_model,
)

MODEL_PRESETS = model_presets()
GPU_PRESETS = gpu_presets()

# Published totals (and active counts for MoE) from the model cards, in billions.
# Qwen3-30B-A3B's card says "3.3B activated", truncating 3.35B: 48 layers x (18.9M attention
# + 8 x 4.72M routed experts + 0.26M router) + 0.62B of embedding and head.
MODEL_CARD_COUNTS = [
    ("qwen2.5-0.5b", 0.49, None),
    ("qwen2.5-7b", 7.62, None),
    ("qwen2.5-72b", 72.7, None),
    ("qwen3-8b", 8.19, None),
    ("qwen3-30b-a3b", 30.5, 3.35),
    ("qwen3-235b-a22b", 235.0, 22.0),
    ("llama-3.1-8b", 8.03, None),
    ("llama-3.1-70b", 70.6, None),
    ("mistral-7b-v0.1", 7.24, None),
    ("gemma-2-9b", 9.24, None),
    ("deepseek-v3", 671.0, None),
    ("gpt-oss-20b", 21.0, None),
    ("gpt-oss-120b", 117.0, None),
]

# Which count a publisher's "active parameters" means: Qwen includes the input embedding;
# DeepSeek and OpenAI count only what a token multiplies (the embedding is a lookup).
ACTIVE_COUNT_CONVENTION = {
    "qwen3-30b-a3b": "active_params",
    "qwen3-235b-a22b": "active_params",
    "deepseek-v3": "active_matmul_params",
    "qwen3-next-80b-a3b": "active_params",
    "gpt-oss-20b": "active_matmul_params",
    "gpt-oss-120b": "active_matmul_params",
    "llama-4-scout-17b-16e": "active_params",
    "llama-4-maverick-17b-128e": "active_params",
    "mixtral-8x7b": "active_params",
    "mixtral-8x22b": "active_params",
    "qwen3-coder-30b-a3b": "active_params",
    "qwen1.5-moe-a2.7b": "active_params",
    "moonlight-16b-a3b": "active_params",
    "qwen3-coder-480b-a35b": "active_params",
    "deepseek-v2-lite": "active_matmul_params",
    "kimi-k2": "active_matmul_params",
    "glm-4.5": "active_matmul_params",
    "glm-4.5-air": "active_matmul_params",
}


def _published_figures() -> dict[str, dict[str, Decimal | int]]:
    """The published counts as written in models.toml, keeping the precision they were given to."""
    text = resources.files("rlplan.presets").joinpath("models.toml").read_text(encoding="utf-8")
    tables = tomllib.loads(text, parse_float=Decimal)
    return {
        name: {key: value for key, value in table.items() if key.startswith("published_")}
        for name, table in tables.items()
    }


def _tolerance_b(published: Decimal | int) -> float:
    """1%, or one unit in the last published digit where the figure is coarser than that.

    Cards round ("14.8B" for 14.77B) or truncate ("3.3B" for 3.35B), so a figure given as
    "1.7B" or "37B" only pins the count to within 0.1B or 1B.
    """
    exponent = published.as_tuple().exponent if isinstance(published, Decimal) else 0
    return max(0.01 * float(published), 10.0 ** min(int(exponent), 0))


PUBLISHED = _published_figures()


def _hf_config(arch: Architecture) -> dict:
    """The config.json keys a preset's numbers come from."""
    config = {
        "model_type": arch.family,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "max_position_embeddings": arch.max_position_embeddings,
        "attention_bias": arch.qkv_bias,
    }
    if arch.family == "deepseek_v3":
        config |= {
            "n_routed_experts": arch.num_experts,
            "n_shared_experts": arch.shared_expert_intermediate_size // arch.moe_intermediate_size,
            "num_experts_per_tok": arch.num_experts_per_token,
            "moe_intermediate_size": arch.moe_intermediate_size,
            "first_k_dense_replace": arch.first_dense_layers,
            "q_lora_rank": arch.q_lora_rank,
            "kv_lora_rank": arch.kv_lora_rank,
            "qk_nope_head_dim": arch.qk_nope_head_dim,
            "qk_rope_head_dim": arch.qk_rope_head_dim,
            "v_head_dim": arch.v_head_dim,
        }
    elif arch.family == "gpt_oss":
        config |= {"num_local_experts": arch.num_experts, "num_experts_per_tok": arch.num_experts_per_token}
    elif arch.is_moe:
        config |= {
            "num_experts": arch.num_experts,
            "num_experts_per_tok": arch.num_experts_per_token,
            "moe_intermediate_size": arch.moe_intermediate_size,
        }
        if arch.family == "qwen2_moe":
            config["shared_expert_intermediate_size"] = arch.shared_expert_intermediate_size
    if arch.rope_scaled:
        config["rope_scaling"] = {"rope_type": arch.rope_scaling_type, "factor": arch.rope_scaling_factor}
        if arch.rope_original_max_position_embeddings:
            config["rope_scaling"]["original_max_position_embeddings"] = arch.rope_original_max_position_embeddings
    if arch.mtp_layers:
        # MiMo: a Qwen2 stack whose config (model_type mimo) counts its multi-token-prediction layers.
        config |= {"model_type": "mimo", "num_nextn_predict_layers": arch.mtp_layers}
    return config


# --- model presets ---------------------------------------------------------------


def test_the_required_model_families_are_covered():
    required = {
        *(f"qwen2.5-{size}" for size in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b")),
        *(f"qwen2-{size}" for size in ("0.5b", "1.5b", "7b", "72b")),
        *(f"qwen3-{size}" for size in ("0.6b", "1.7b", "4b", "8b", "14b", "32b", "30b-a3b", "235b-a22b")),
        *"llama-3.1-8b llama-3.1-70b llama-3.1-405b llama-3.2-1b llama-3.2-3b llama-3.3-70b".split(),
        *"mistral-7b-v0.1 mistral-7b-v0.3 mistral-nemo-12b gemma-2-2b gemma-2-9b gemma-2-27b".split(),
        *"deepseek-v3 gpt-oss-20b gpt-oss-120b".split(),
    }
    assert required <= set(MODEL_PRESETS)


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_every_model_preset_is_a_valid_architecture_with_repos(name):
    preset = MODEL_PRESETS[name]
    assert preset.name == name == name.lower()
    assert isinstance(preset.arch, Architecture)
    assert preset.repo_ids and preset.default_repo_id == preset.repo_ids[0]
    for repo_id, overrides in preset.repo_overrides:
        variant = preset.arch_for(repo_id)
        assert variant != preset.arch
        # Overrides never touch a weight shape: same parameter count as the preset.
        assert variant.total_params == preset.arch.total_params, dict(overrides)


def test_no_repo_id_is_listed_by_two_presets():
    listed = [repo_id.lower() for preset in MODEL_PRESETS.values() for repo_id in preset.repo_ids]
    assert len(listed) == len(set(listed))


# The families _hf_config writes; the others (Gemma 3, Llama 4, Mixtral, GLM, vision-language
# models) are checked against their published config.json in test_model_configs.py.
ROUND_TRIP_FAMILIES = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama", "mistral", "gemma2", "deepseek_v3", "gpt_oss"}


@pytest.mark.parametrize("name", [name for name, preset in MODEL_PRESETS.items()
                                  if preset.arch.family in ROUND_TRIP_FAMILIES and not preset.arch.vision_params])
def test_preset_agrees_with_reading_the_same_numbers_from_config_json(name):
    arch = MODEL_PRESETS[name].arch
    assert architecture_from_hf_config(_hf_config(arch)) == arch


@pytest.mark.parametrize(("name", "total_b", "active_b"), MODEL_CARD_COUNTS)
def test_preset_reproduces_the_model_card_parameter_count_within_one_percent(name, total_b, active_b):
    arch = MODEL_PRESETS[name].arch
    assert arch.total_params / 1e9 == pytest.approx(total_b, rel=0.01)
    if active_b is not None:
        active = getattr(arch, ACTIVE_COUNT_CONVENTION[name])
        assert active / 1e9 == pytest.approx(active_b, rel=0.01)


@pytest.mark.parametrize("name", [name for name, figures in PUBLISHED.items() if figures])
def test_preset_reproduces_its_recorded_published_counts(name):
    preset = MODEL_PRESETS[name]
    figures = PUBLISHED[name]
    total = figures["published_params_b"]
    assert float(total) == preset.published_params_b
    assert abs(preset.arch.total_params / 1e9 - float(total)) <= _tolerance_b(total)
    if "published_active_params_b" in figures:
        active = figures["published_active_params_b"]
        count = getattr(preset.arch, ACTIVE_COUNT_CONVENTION[name])
        assert abs(count / 1e9 - float(active)) <= _tolerance_b(active)


def test_every_moe_preset_states_how_its_active_count_was_published():
    moe_with_active = {name for name, preset in MODEL_PRESETS.items() if preset.published_active_params_b}
    assert moe_with_active == set(ACTIVE_COUNT_CONVENTION)


# --- resolving --model -----------------------------------------------------------


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_preset_name_resolves_in_any_case_to_its_default_repo(name):
    preset = MODEL_PRESETS[name]
    resolved = resolve_model(name.upper())
    assert (resolved.name, resolved.path, resolved.arch) == (name, preset.default_repo_id, preset.arch)


@pytest.mark.parametrize(
    ("name", "repo_id"),
    [(name, repo_id) for name, preset in MODEL_PRESETS.items() for repo_id in preset.repo_ids],
)
def test_every_listed_repo_id_resolves_to_its_preset(name, repo_id):
    for spelling in (repo_id, repo_id.lower(), repo_id.upper()):
        resolved = resolve_model(spelling)
        assert resolved.name == name
        assert resolved.path == spelling
        assert resolved.arch == MODEL_PRESETS[name].arch_for(repo_id)


@pytest.mark.parametrize(
    ("repo_id", "name", "max_position_embeddings"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", 32768),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b", 131072),
        ("Qwen/Qwen2.5-Math-1.5B", "qwen2.5-math-1.5b", 4096),
        ("Qwen/Qwen2.5-Math-7B", "qwen2.5-math-7b", 4096),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-r1-distill-qwen-1.5b", 131072),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2.5-math-7b", 131072),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "qwen2.5-14b", 131072),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b", 131072),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b", 131072),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "llama-3.3-70b", 131072),
        ("Qwen/Qwen3-8B", "qwen3-8b", 40960),
        ("Qwen/Qwen3-8B-Base", "qwen3-8b", 32768),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b", 131072),
    ],
)
def test_variants_resolve_to_their_base_architecture_with_their_own_context(
    repo_id, name, max_position_embeddings
):
    resolved = resolve_model(repo_id)
    assert resolved.name == name
    assert resolved.arch.max_position_embeddings == max_position_embeddings
    assert resolved.arch.total_params == MODEL_PRESETS[name].arch.total_params


def test_the_r1_distill_of_qwen_math_1_5b_differs_only_by_its_untied_head():
    distill = MODEL_PRESETS["deepseek-r1-distill-qwen-1.5b"].arch
    base = MODEL_PRESETS["qwen2.5-math-1.5b"].arch
    assert distill.total_params - base.total_params == base.vocab_size * base.hidden_size


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b"),
        ("Qwen/Qwen3-30B-A3B-GPTQ-Int4", "qwen3-30b-a3b"),
        ("Qwen2.5-Math-7B-Instruct", "qwen2.5-math-7b"),
        ("  qwen/qwen2.5-0.5b-instruct ", "qwen2.5-0.5b"),
    ],
)
def test_suffixed_and_organisation_less_repo_names_resolve_to_the_longest_listed_repo(spec, name):
    resolved = resolve_model(spec)
    assert resolved.name == name
    assert resolved.path == spec.strip()


def test_a_suffixed_base_repo_keeps_the_base_repo_context():
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct-AWQ").arch.max_position_embeddings == 32768
    assert resolve_model("Qwen/Qwen2.5-7B-FP8").arch.max_position_embeddings == 131072


@pytest.mark.parametrize(
    "spec", ["Qwen/Qwen2.5-8B-Instruct", "qwen2.5-7", "deepseek-ai/DeepSeek-V3.2", "Qwen/Qwen2-Math-7B"]
)
def test_unknown_model_is_a_plan_error_on_model_with_nearest_presets_and_the_fix(spec):
    with pytest.raises(PlanError) as raised:
        resolve_model(spec)
    error = raised.value
    assert error.field == "model"
    assert repr(spec) in error.message
    assert "rlplan presets models" in error.fix and "config.json" in error.fix


def test_unknown_model_names_the_nearest_presets():
    with pytest.raises(PlanError, match=r"Nearest presets: qwen2\.5-7b") as raised:
        resolve_model("Qwen/Qwen2.5-8B-Instruct")
    assert "llama" not in raised.value.message
    with pytest.raises(PlanError, match=r"llama-3\.1-8b"):
        resolve_model("llama3-8b")


def test_a_preset_name_wins_over_a_repo_of_the_same_bare_name():
    # "Qwen2.5-7B" is both the preset qwen2.5-7b and the bare name of the base repo Qwen/Qwen2.5-7B.
    assert resolve_model("Qwen2.5-7B").path == MODEL_PRESETS["qwen2.5-7b"].default_repo_id
    assert resolve_model("Qwen/Qwen2.5-7B").path == "Qwen/Qwen2.5-7B"


QWEN_LOCAL_CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("/ckpt/my-qwen", "my-qwen"),
        ("/ckpt/my-qwen/", "my-qwen"),
        ("/ckpt/my-qwen/config.json", "my-qwen"),
        ("qwen2.5-7b", "qwen2.5-7b"),
    ],
)
def test_local_config_resolves_from_its_own_numbers(spec, name):
    resolved = resolve_model(spec, local_config=QWEN_LOCAL_CONFIG)
    assert resolved.name == name
    assert resolved.path == spec
    # The user's own config.json wins over a preset of the same name.
    assert resolved.arch == MODEL_PRESETS["qwen2.5-0.5b"].arch


def test_local_config_without_an_architecture_is_a_plan_error_on_model():
    with pytest.raises(PlanError) as raised:
        resolve_model("/ckpt/tokenizer-only", local_config={"model_type": "qwen2"})
    assert raised.value.field == "model"


# --- GPU presets -----------------------------------------------------------------


def test_the_required_gpus_are_covered():
    required = set(
        "H100-80G H100-PCIE-80G H200-141G H800-80G H20-96G A100-40G A100-80G L40S-48G RTX4090-24G "
        "MI300X-192G B200-180G H100-NVL-94G H20-141G A100-PCIE-80G A800-80G L20-48G L4-24G A10G-24G "
        "RTX-A6000-48G RTX6000-ADA-48G RTX5090-32G RTX3090-24G GB200-186G B300-288G MI325X-256G MI355X-288G".split()
    )
    assert required <= set(GPU_PRESETS)


@pytest.mark.parametrize("name", list(GPU_PRESETS))
def test_every_gpu_preset_resolves_by_name_in_any_case(name):
    spec = GPU_PRESETS[name]
    assert isinstance(spec, GpuSpec) and spec.name == name
    assert resolve_gpu(name) == resolve_gpu(name.lower()) == resolve_gpu(f" {name.upper()} ") == spec


@pytest.mark.parametrize("name", list(GPU_PRESETS))
def test_usable_memory_is_just_below_the_boards_nominal_size(name):
    # The driver keeps a few percent of HBM; "-180G" boards report ~178 GiB, "-80G" ~79 GiB.
    nominal = float(name.rsplit("-", 1)[1].removesuffix("G"))
    assert 0.9 * nominal < GPU_PRESETS[name].memory_gib < nominal


def test_h100_memory_is_the_llm_d_measurement():
    assert resolve_gpu("h100").memory_gib == 79.18


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("h100", "H100-80G"),
        ("H100 80GB", "H100-80G"),
        ("NVIDIA H100 80GB HBM3", "H100-80G"),
        ("NVIDIA H100 PCIe", "H100-PCIE-80G"),
        ("h200", "H200-141G"),
        ("NVIDIA A100-SXM4-80GB", "A100-80G"),
        ("a100_40gb", "A100-40G"),
        ("NVIDIA GeForce RTX 4090", "RTX4090-24G"),
        ("AMD Instinct MI300X", "MI300X-192G"),
        ("b200", "B200-180G"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80G"),
        ("NVIDIA H100 NVL", "H100-NVL-94G"),
        ("NVIDIA GeForce RTX 5090", "RTX5090-32G"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000-ADA-48G"),
        ("AMD Instinct MI355X", "MI355X-288G"),
    ],
)
def test_gpu_aliases_and_device_names_resolve(alias, name):
    assert resolve_gpu(alias) == GPU_PRESETS[name]


# No deadline: the first example loads the presets, which on a loaded shared machine took 0.9 s.
@settings(deadline=None)
@given(
    name=st.sampled_from(list(GPU_PRESETS)),
    flips=st.lists(st.booleans(), min_size=20, max_size=20),
    separator=st.sampled_from(["-", "_", " "]),
)
def test_gpu_names_resolve_regardless_of_case_and_separators(name, flips, separator):
    respelled = "".join(char.upper() if flips[i] else char.lower() for i, char in enumerate(name))
    assert resolve_gpu(respelled.replace("-", separator)) == GPU_PRESETS[name]


def test_an_ambiguous_gpu_alias_names_every_candidate():
    with pytest.raises(PlanError) as raised:
        resolve_gpu("A100")
    error = raised.value
    assert error.field == "cluster.gpu"
    assert "A100-40G" in error.message and "A100-80G" in error.message
    assert "--gpu-mem" in error.fix


def test_unknown_gpu_is_a_plan_error_listing_the_gpus_and_the_fix():
    with pytest.raises(PlanError) as raised:
        resolve_gpu("TPU-v5e")
    error = raised.value
    assert error.field == "cluster.gpu"
    assert all(name in error.message for name in GPU_PRESETS)
    assert "--gpu-mem GiB" in error.fix


@pytest.mark.parametrize(
    ("memory_gib", "name"), [(40, "custom-40g"), (23.5, "custom-23.5g"), (79.18, "custom-79.18g")]
)
def test_custom_gpu_is_named_for_its_memory_with_modest_speeds(memory_gib, name):
    gpu = custom_gpu(memory_gib)
    assert (gpu.name, gpu.memory_gib) == (name, memory_gib)
    # No faster than an A100 on any axis, and no NVLink assumed.
    a100 = GPU_PRESETS["A100-80G"]
    assert gpu.bf16_tflops <= a100.bf16_tflops and gpu.hbm_gbps <= a100.hbm_gbps
    assert gpu.pcie_gbps <= a100.pcie_gbps
    assert gpu.intranode_gbps <= gpu.pcie_gbps


@pytest.mark.parametrize("memory_gib", [0, -8, float("nan"), float("inf")])
def test_custom_gpu_rejects_memory_that_is_not_a_positive_finite_size(memory_gib):
    with pytest.raises(PlanError) as raised:
        custom_gpu(memory_gib)
    assert raised.value.field == "--gpu-mem"


@pytest.mark.parametrize(("text", "gib"), [("80", 80.0), ("79.18GiB", 79.18), ("80GB", 80e9 / 2**30),
                                           ("81559MiB", 81559 / 1024), ("81559 MiB", 81559 / 1024), ("0.25TiB", 256.0)])
def test_gpu_memory_takes_gib_or_a_unit(text, gib):
    assert parse_gpu_memory(text) == pytest.approx(gib)


@pytest.mark.parametrize("text", ["80000", "0.5", "3000GB", "80 furlongs", "abc", "", "nan", "inf"])
def test_gpu_memory_that_no_gpu_has_is_bad_input_naming_the_flag(text):
    with pytest.raises(PlanError) as raised:
        parse_gpu_memory(text)
    assert raised.value.field == "--gpu-mem"


def test_a_bare_number_in_mib_gets_the_mib_spelling_as_its_fix():
    with pytest.raises(PlanError) as raised:
        parse_gpu_memory("80000")
    assert "--gpu-mem 80000MiB" in raised.value.fix


def test_custom_gpu_takes_given_speeds_and_names_the_defaults_it_used():
    gpu = custom_gpu(80, bf16_tflops=500.0, hbm_gbps=2000.0)
    assert (gpu.bf16_tflops, gpu.hbm_gbps) == (500.0, 2000.0)
    assert defaulted_speeds(500.0, 2000.0) == ""
    assert "--gpu-tflops" in defaulted_speeds(None, 2000.0) and "--gpu-bandwidth" not in defaulted_speeds(None, 2000.0)
    with pytest.raises(PlanError) as raised:
        custom_gpu(80, bf16_tflops=float("nan"))
    assert raised.value.field == "--gpu-tflops"


@pytest.mark.parametrize("name", sorted(gpu_presets()))
def test_every_gpu_preset_states_its_typical_host_ram_and_where_the_figure_comes_from(name):
    from rlplan.planner.presets import typical_host_memory

    gpu = gpu_presets()[name]
    node = typical_host_memory(gpu, 8)
    assert node.gib >= 8 * 16 and len(node.source) > 20
    # Per GPU, so a node of four holds half of a node of eight, and one desktop card its own figure.
    assert typical_host_memory(gpu, 4).gib == pytest.approx(node.gib / 2, abs=0.1)


def test_host_ram_figures_of_the_classes_the_issue_names():
    from rlplan.planner.presets import resolve_gpu, typical_host_memory

    assert typical_host_memory(resolve_gpu("h100-80g"), 8).gib == 2048       # 8x H100 HGX: DGX H100, AWS p5
    assert typical_host_memory(resolve_gpu("a100-40g"), 8).gib == 1152       # AWS p4d.24xlarge
    assert typical_host_memory(resolve_gpu("rtx4090"), 1).gib == 64          # a desktop with one card
    assert "workstation" in typical_host_memory(resolve_gpu("rtx-a6000"), 1).source


@pytest.mark.parametrize(("text", "gib"), [("512", 512.0), ("512GiB", 512.0), ("550GB", 550e9 / 2**30),
                                           ("0.5TiB", 512.0)])
def test_host_memory_takes_units_as_gpu_memory_does(text, gib):
    from rlplan.planner.presets import parse_host_memory

    assert parse_host_memory(text) == pytest.approx(gib)


@pytest.mark.parametrize("text", ["0", "-1", "nan", "lots", "inf"])
def test_host_memory_that_is_no_amount_is_bad_input_naming_the_flag(text):
    from rlplan.planner.presets import parse_host_memory

    with pytest.raises(PlanError) as error:
        parse_host_memory(text)
    assert error.value.field == "--host-mem"
