"""Reading published config.json files of current families (planner/hf_config.py), the presets
built from them, and the features rlplan refuses rather than mis-cost."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app
from rlplan.planner.errors import PlanError
from rlplan.planner.hf_config import _LIGHT_DEFAULTS, architecture_from_hf_config
from rlplan.planner.presets import model_presets, resolve_model, unsupported_models
from tests.planner.published_configs import PUBLISHED_CONFIGS, QWEN3_NEXT_80B_A3B

MODEL_PRESETS = model_presets()
# Repos whose model_type transformers has no config class for: read by the light reader either way.
NOT_IN_TRANSFORMERS = {"moonshotai/Kimi-K2-Instruct", "openbmb/MiniCPM-o-2_6"}
# Omni models (remote code only): their towers are held to transformers' modules one by one below.
OMNI = {"openbmb/MiniCPM-o-2_6"}
VISION_LANGUAGE = [repo for repo, config in PUBLISHED_CONFIGS.items() if "vision_config" in config and repo not in OMNI]


def _read(repo: str, read_with: str):
    return architecture_from_hf_config(copy.deepcopy(PUBLISHED_CONFIGS[repo]), source=repo, read_with=read_with)


@pytest.mark.parametrize("repo", [repo for repo in PUBLISHED_CONFIGS if repo not in NOT_IN_TRANSFORMERS])
def test_transformers_and_light_readers_give_the_same_architecture(repo):
    pytest.importorskip("transformers", reason="the AutoConfig path needs transformers")
    assert _read(repo, "transformers") == _read(repo, "light")


@pytest.mark.parametrize("repo", list(PUBLISHED_CONFIGS))
def test_the_preset_listing_a_repo_is_what_its_published_config_reads_as(repo):
    assert resolve_model(repo).arch == _read(repo, "auto") == _read(repo, "light")


def test_every_new_family_has_a_published_config_fixture():
    families = {MODEL_PRESETS[resolve_model(repo).name].arch.family for repo in PUBLISHED_CONFIGS}
    assert {"gemma3", "llama4", "mixtral", "phi3", "glm4_moe", "deepseek_v3", "qwen2", "qwen3", "qwen3_moe",
            "mistral"} <= families


def test_kimi_k2_model_type_reads_as_deepseek_v3_with_or_without_transformers():
    assert _read("moonshotai/Kimi-K2-Instruct", "auto").family == "deepseek_v3"


@pytest.mark.parametrize(("model_type", "defaults"), list(_LIGHT_DEFAULTS.items()))
def test_light_defaults_are_the_transformers_class_defaults(model_type, defaults):
    transformers = pytest.importorskip("transformers", reason="the light table mirrors transformers' classes")
    composite = {"siglip_vision_model": ("gemma3", "vision_config"),
                 "llama4_vision_model": ("llama4", "vision_config"),
                 "qwen2_5_vl_vision": ("qwen2_5_vl", "vision_config"),
                 "qwen3_vl_vision": ("qwen3_vl", "vision_config"),
                 "qwen3_vl_moe_vision": ("qwen3_vl_moe", "vision_config"),
                 "glm4v_vision": ("glm4v", "vision_config")}
    if model_type in composite:
        parent, part = composite[model_type]
        config = getattr(transformers.CONFIG_MAPPING[parent](), part)
    else:
        config = transformers.CONFIG_MAPPING[model_type]()
    read = {key: list(value) if isinstance(value, tuple) else value
            for key, value in ((key, getattr(config, key)) for key in defaults)}
    assert read == defaults


@pytest.mark.parametrize("repo", VISION_LANGUAGE)
def test_vision_tower_formula_matches_transformers(repo):
    torch = pytest.importorskip("torch", reason="counting the real modules needs torch")
    transformers = pytest.importorskip("transformers", reason="counting the real modules needs transformers")
    config = transformers.AutoConfig.for_model(**copy.deepcopy(PUBLISHED_CONFIGS[repo]))
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    tower = ("visual.", "vision_tower.", "vision_model.", "multi_modal_projector.")
    counted = sum(p.numel() for name, p in model.named_parameters() if any(part in name for part in tower))
    assert _read(repo, "light").vision_params == counted


def test_glm4v_total_is_every_parameter_transformers_builds_from_the_published_config():
    """Text stack (four norms per layer, q/k/v bias, untied head) and tower together: 10,292,777,472."""
    torch = pytest.importorskip("torch", reason="counting the real modules needs torch")
    transformers = pytest.importorskip("transformers", reason="counting the real modules needs transformers")
    repo = "zai-org/GLM-4.1V-9B-Thinking"
    config = transformers.AutoConfig.for_model(**copy.deepcopy(PUBLISHED_CONFIGS[repo]))
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    assert _read(repo, "light").total_params == sum(p.numel() for p in model.parameters())


def test_minicpmo_towers_are_what_transformers_builds_for_each_part():
    """MiniCPMO builds its SigLIP (no pooling head), Whisper encoder and ChatTTS's Llama stack from transformers'
    classes, and its resampler around torch's MultiheadAttention: each counted against its formula."""
    torch = pytest.importorskip("torch", reason="counting the real modules needs torch")
    transformers = pytest.importorskip("transformers", reason="counting the real modules needs transformers")
    from rlplan.planner import hf_config

    config = copy.deepcopy(PUBLISHED_CONFIGS["openbmb/MiniCPM-o-2_6"])
    vision, audio = config["vision_config"], config["audio_config"]

    def whole(part, key, default=0):
        return part.get(key, default)

    def count(module):
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        siglip = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision, vision_use_head=False))
        whisper = transformers.models.whisper.modeling_whisper.WhisperEncoder(transformers.WhisperConfig(**audio))
        llama = transformers.LlamaModel(transformers.LlamaConfig(hidden_size=768, intermediate_size=3072,
                                                                 num_attention_heads=12, num_hidden_layers=20))
        attention = torch.nn.MultiheadAttention(3584, 28)
    assert hf_config._navit_siglip_params(vision, 27, whole) == count(siglip)
    assert hf_config._whisper_encoder_params(audio, whole) == count(whisper)
    resampler_rest = 64 * 3584 + 1152 * 3584 + 6 * 3584 + 3584 * 3584  # queries, kv_proj, three LayerNorms, proj
    assert hf_config._resampler_params(64, 3584, 1152) == count(attention) + resampler_rest
    tts = {**hf_config._CHATTTS_DEFAULTS, "llm_dim": 3584}
    around_llama = (3584 * 768 + 768 + 768 * 768 + 768) + 4 * 626 * 768 + 21178 * 768 + 4 * (768 * 626 + 626)
    assert hf_config._chattts_params(tts, whole) == count(llama) + around_llama + hf_config._DVAE_PARAMS


def test_minicpmo_prices_only_the_towers_its_init_flags_build():
    full = _read("openbmb/MiniCPM-o-2_6", "light")
    assert full.total_params == 8_674_997_028 and full.total_params - full.vision_params == 7_613_007_360
    sizes = {}
    for flag in ("init_vision", "init_audio", "init_tts"):
        config = {**copy.deepcopy(PUBLISHED_CONFIGS["openbmb/MiniCPM-o-2_6"]), flag: False}
        sizes[flag] = full.vision_params - architecture_from_hf_config(config, read_with="light").vision_params
    assert sizes == {"init_vision": 417_792_240 + 68_619_264, "init_audio": 307_216_384 + 16_522_240,
                     "init_tts": 251_839_540}
    # The config class drops SigLIP's last layer unless the file says otherwise.
    dropping = {**copy.deepcopy(PUBLISHED_CONFIGS["openbmb/MiniCPM-o-2_6"]), "drop_vision_last_layer": True}
    assert full.vision_params - architecture_from_hf_config(dropping).vision_params == 15_239_504
    assert full.kv_cache_bytes_per_token() == MODEL_PRESETS["qwen2.5-7b"].arch.kv_cache_bytes_per_token()


def test_vision_language_presets_price_the_tower_outside_the_text_path():
    arch = MODEL_PRESETS["qwen2.5-vl-7b"].arch
    text_only = MODEL_PRESETS["qwen2.5-7b"].arch
    assert arch.vision_params > 0.6e9
    assert arch.total_params == text_only.total_params + arch.vision_params
    assert arch.active_params == text_only.active_params
    assert arch.kv_cache_bytes_per_token() == text_only.kv_cache_bytes_per_token()


# --- refusals -----------------------------------------------------------------------


def test_qwen3_next_reads_its_gated_deltanet_layers_as_transformers_builds_them():
    """36 GDN mixers and 12 gated-attention ones, counted against Qwen3NextForCausalLM's modules; rlplan leaves out
    the shared expert's 2048-element gate per layer (as for Qwen2-MoE)."""
    torch = pytest.importorskip("torch", reason="counting the real modules needs torch")
    transformers = pytest.importorskip("transformers", reason="counting the real modules needs transformers")
    arch = _read("Qwen/Qwen3-Next-80B-A3B-Instruct", "light")
    assert (arch.linear_attention_layers, arch.num_full_attention_layers, arch.num_moe_layers) == (36, 12, 48)
    config = transformers.AutoConfig.for_model(**copy.deepcopy(QWEN3_NEXT_80B_A3B))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    layers = model.model.layers
    kinds = {type(layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn).__name__ for layer in layers}
    assert len(kinds) == 2 and sum(hasattr(layer, "linear_attn") for layer in layers) == 36

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert arch.linear_attention_params == count(layers[0].linear_attn)
    assert arch.attention_params == count(layers[3].self_attn)
    assert arch.total_params == count(model) - 48 * 2048


def test_qwen3_next_layer_types_and_full_attention_interval_read_alike():
    stated = {**copy.deepcopy(QWEN3_NEXT_80B_A3B),
              "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)]}
    assert architecture_from_hf_config(stated, read_with="light") == _read("Qwen/Qwen3-Next-80B-A3B-Instruct", "light")
    every_other = {**copy.deepcopy(QWEN3_NEXT_80B_A3B), "full_attention_interval": 2}
    assert architecture_from_hf_config(every_other, read_with="light").linear_attention_layers == 24


@pytest.mark.parametrize("spec", ["qwen3-next-80b-a3b", "Qwen/Qwen3-Next-80B-A3B-Instruct",
                                  "Qwen/Qwen3-Next-80B-A3B-Thinking"])
def test_qwen3_next_by_name_or_repo_is_the_hybrid_preset(spec):
    arch = resolve_model(spec).arch
    assert arch.linear_attention_layers == 36
    # Only the 12 attention layers keep a KV cache: 12 x 2 KV heads x 256 x 2 (K, V) x 2 bytes.
    assert arch.kv_cache_bytes_per_token() == 12 * 2 * 256 * 2 * 2


def test_every_unsupported_release_states_a_reason_and_solve_exits_2_naming_it(monkeypatch):
    from rlplan.planner import presets

    # models.toml prices every release it lists today: a stand-in refused release keeps the refusal tested.
    refused = {**unsupported_models(), "omni-9b": ("its speech tower is not priced", ("example/Omni-9B-Instruct",))}
    monkeypatch.setattr(presets, "unsupported_models", lambda: refused)
    for name, (reason, _) in refused.items():
        assert reason
        result = CliRunner().invoke(app, ["solve", "--model", name, "--gpus", "8", "--gpu", "h100-80g",
                                          "--prompt-len", "1024", "--response-len", "1024"])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert reason.split(" (")[0][:20] in " ".join(result.output.split())


@pytest.mark.parametrize(("extra", "feature"), [
    ({"layer_types": ["full_attention", "mamba"]}, "linear-attention / state-space layers"),
    ({"ssm_state_size": 128}, "ssm_state_size"),
    ({"audio_config": {"hidden_size": 1280}}, "audio_config"),
    ({"is_encoder_decoder": True}, "encoder-decoder"),
])
def test_unmodelled_features_are_refused_by_name(extra, feature):
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
              "vocab_size": 1000, **extra}
    for read_with in ("auto", "light"):
        with pytest.raises(PlanError) as raised:
            architecture_from_hf_config(config, read_with=read_with)
        assert feature in raised.value.message


def test_a_vision_tower_rlplan_cannot_size_is_refused_by_name():
    config = {"model_type": "mistral3", "text_config": {"model_type": "mistral", "hidden_size": 5120,
                                                        "num_hidden_layers": 40, "num_attention_heads": 32,
                                                        "vocab_size": 131072},
              "vision_config": {"model_type": "pixtral", "hidden_size": 1024}}
    with pytest.raises(PlanError) as raised:
        architecture_from_hf_config(config, read_with="light")
    assert "vision tower (mistral3)" in raised.value.message


def test_sliding_window_layer_types_are_read_not_refused():
    arch = resolve_model("gemma-3-27b").arch
    assert arch.family == "gemma3" and arch.qk_norm and arch.norms_per_layer == 4


# --- context lengths and known bases ------------------------------------------------------


@pytest.mark.parametrize("repo", ["Qwen/Qwen2.5-7B-Instruct-1M", "Qwen/Qwen2.5-14B-Instruct-1M"])
def test_a_1m_context_release_keeps_its_context(repo):
    assert resolve_model(repo).arch.max_position_embeddings == 1010000


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-32B-Instruct-1M", "Qwen/Qwen2.5-7B-Instruct-128k"])
def test_an_unlisted_context_length_suffix_is_not_taken_for_the_short_preset(spec):
    with pytest.raises(PlanError) as raised:
        resolve_model(spec)
    assert "config.json" in raised.value.fix


def test_an_rl_fine_tune_resolves_to_its_known_base():
    resolved = resolve_model("agentica-org/DeepScaleR-1.5B-Preview")
    assert resolved.name == "deepseek-r1-distill-qwen-1.5b"
    assert resolved.path == "agentica-org/DeepScaleR-1.5B-Preview"


def test_an_unknown_repo_is_told_how_to_pass_its_config_json():
    with pytest.raises(PlanError) as raised:
        resolve_model("someone/SomeRL-7B")
    assert "huggingface-cli download" in raised.value.fix and "--model DIR" in raised.value.fix


# --- every new preset solves --------------------------------------------------------------


def _cluster_for(params: float) -> list[str]:
    """A cluster such a model is trained on: rollout weights at TP 8-16 must fit one GPU's memory."""
    gpus, gpu, host = ((8, "h100-80g", 2048) if params < 50e9 else (32, "h100-80g", 2048) if params < 200e9
                       else (128, "h200-141g", 2048) if params < 600e9 else (256, "h200-141g", 4096))
    return ["--gpus", str(gpus), "--gpus-per-node", "8", "--gpu", gpu, "--host-mem", str(host)]


@pytest.mark.parametrize("repo", list(PUBLISHED_CONFIGS))
def test_every_new_preset_solves(repo):
    name = resolve_model(repo).name
    cluster = _cluster_for(MODEL_PRESETS[name].arch.total_params)
    result = CliRunner().invoke(app, ["solve", "--model", name, *cluster, "--prompt-len", "1024",
                                      "--response-len", "2048", "--json"])
    assert "Traceback" not in result.output
    assert result.exit_code == 0, result.output[-2000:]


# --- the planner-only install and --model DIR ----------------------------------------------


def test_without_transformers_auto_reads_with_the_light_reader(monkeypatch):
    import rlplan.planner.hf_config as hf_config_module

    monkeypatch.setattr(hf_config_module, "_transformers_config_classes", lambda: None)
    for repo in PUBLISHED_CONFIGS:
        assert _read(repo, "auto") == resolve_model(repo).arch


def test_a_planner_only_interpreter_reads_gemma_3_without_transformers(tmp_path):
    # transformers made unimportable, as on `pip install -e .`: the light reader supplies the class defaults.
    config = tmp_path / "config.json"
    config.write_text(json.dumps(PUBLISHED_CONFIGS["google/gemma-3-4b-it"]))
    code = ("import sys; sys.modules['transformers'] = None; "
            "from rlplan.planner.commands.solve_commands import resolve_model_arg; "
            f"print(resolve_model_arg({str(tmp_path)!r}).arch.vocab_size)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "262208"


def test_solve_reads_a_local_config_json_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED_CONFIGS["Qwen/Qwen2.5-VL-7B-Instruct"]))
    plan = tmp_path / "plan.toml"
    result = CliRunner().invoke(app, ["solve", "--model", str(tmp_path), "--gpus", "8", "--gpu", "h100-80g",
                                      "--prompt-len", "1024", "--response-len", "2048", "-o", str(plan)])
    assert result.exit_code == 0, result.output
    assert f"vision_params = {MODEL_PRESETS['qwen2.5-vl-7b'].arch.vision_params}" in plan.read_text()


_MODEL_TYPES_WITH_EXPERT_KEYS = {
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "glm4_moe": {"n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 64, "first_k_dense_replace": 1},
    "llama4_text": {"num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size_mlp": 256},
}


@settings(max_examples=40, deadline=None)
@given(
    model_type=st.sampled_from(["qwen2", "qwen3", "llama", "mistral", "phi3", "gemma3_text", "qwen3_moe", "mixtral",
                                "glm4_moe", "llama4_text"]),
    heads=st.sampled_from([4, 8, 16]),
    kv_divisor=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([32, 64, 128]),
    layers=st.integers(1, 12),
    width=st.integers(1, 64).map(lambda units: units * 64),
    vocab=st.integers(100, 5000),
    tied=st.booleans(),
)
def test_readers_agree_on_every_complete_config(model_type, heads, kv_divisor, head_dim, layers, width, vocab, tied):
    config = {"model_type": model_type, "hidden_size": heads * head_dim, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": heads // kv_divisor, "head_dim": head_dim,
              "intermediate_size": width, "vocab_size": vocab, "tie_word_embeddings": tied,
              "max_position_embeddings": 4096, **_MODEL_TYPES_WITH_EXPERT_KEYS.get(model_type, {})}
    pytest.importorskip("transformers", reason="compares with transformers' config classes")
    assert architecture_from_hf_config(dict(config), read_with="transformers") == architecture_from_hf_config(
        dict(config), read_with="light")


def test_rope_scaling_is_read_as_verl_and_vllm_read_it_from_the_top_of_config_json():
    # deepseek-coder-6.7b: linear x4 on 16384 positions; vLLM's derived length is 65536, and so is verl 0.5-0.6's.
    coder = _read("deepseek-ai/deepseek-coder-6.7b-instruct", "auto")
    assert (coder.rope_scaling_type, coder.rope_scaling_factor) == ("linear", 4.0)
    assert coder.vllm_derived_max_model_len() == coder.rope_scaled_positions == 65536
    # Qwen2.5-VL's mrope is a rope_scaling verl's rollouts see (its assert is skipped at v0.4.x), of factor 1.
    for read_with in ("auto", "light"):
        vl = _read("Qwen/Qwen2.5-VL-7B-Instruct", read_with)
        assert vl.rope_scaled and vl.rope_scaling_type == "mrope"
        assert vl.vllm_derived_max_model_len() == vl.rope_scaled_positions == vl.max_position_embeddings
    # YaRN counts vLLM's length from original_max_position_embeddings: DeepSeek-V2-Lite's 4096 x 40.
    assert _read("deepseek-ai/DeepSeek-V2-Lite-Chat", "light").vllm_derived_max_model_len() == 163840
    plain = _read("deepseek-ai/deepseek-llm-7b-chat", "light")
    assert not plain.rope_scaled and plain.vllm_derived_max_model_len() == plain.max_position_embeddings


@pytest.mark.parametrize("rope_scaling", ["yarn", {"type": "yarn", "factor": 0}, {"rope_type": 3, "factor": 2.0},
                                          {"type": "linear", "factor": True}])
def test_a_malformed_rope_scaling_is_refused_naming_it(rope_scaling):
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
              "vocab_size": 1000, "rope_scaling": rope_scaling}
    with pytest.raises(PlanError) as raised:
        architecture_from_hf_config(config, read_with="light")
    assert raised.value.field == "model.rope_scaling"


def test_vllms_derived_length_per_release_flags_gemma3_and_yarn():
    """vLLM 0.8.0-0.29 (the defaults): Gemma 3 unscaled, YaRN from original x factor; before 0.8.0 Gemma 3 is
    scaled like any linear config; from 0.30.0 YaRN's positions stand (rules.memory.vllm_derived_max_model_len)."""
    deepseek = _read("deepseek-ai/DeepSeek-V2-Lite-Chat", "light")
    assert deepseek.vllm_derived_max_model_len(yarn_prescaled=True) == deepseek.max_position_embeddings == 163840
    yarn = attrs.evolve(deepseek, max_position_embeddings=32768)  # Qwen-style: the positions unscaled, factor 4
    assert yarn.vllm_derived_max_model_len() == 4096 * 40
    assert yarn.vllm_derived_max_model_len(yarn_prescaled=True) == 32768
    gemma = attrs.evolve(resolve_model("gemma-3-27b").arch, rope_scaling_type="linear", rope_scaling_factor=8.0)
    assert gemma.vllm_derived_max_model_len() == gemma.max_position_embeddings
    assert gemma.vllm_derived_max_model_len(gemma3_prescaled=False) == 8 * gemma.max_position_embeddings
