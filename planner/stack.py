"""The target stack: the verl and rollout-engine versions a plan is for, and what changes with them.

One owner for versions: parsing and comparing them, the default stack (the versions rlplan's rules
are checked against, printed by `rlplan --version`), and the table of version-dependent behaviours,
each with its verl code path and the version range it holds for, as data. Defaults, rules (`@rule`'s
`applies`), memory and render read `holds(behaviour, stack)`; none of them compares versions itself.
Every range was read in volcengine/verl's tagged sources (docs/verl-versions.md lists them).
Pure values: no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.errors import PlanError, shorten

Package = Literal["verl", "vllm", "sglang", "trtllm"]
Version = tuple[int, int, int]
VllmEngine = Literal["v0", "v1"]

# verl: the version nox's verl_compat session installs and checks the rules against (noxfile.VERL).
DEFAULT_VERL = "0.9.1"
# The engine versions rlplan's rollout terms were read at: vLLM's V1 engine at 0.11 (llm-d, memory-model.md G6-G8;
# the KV capacity is checked against vLLM 0.32's own engine on CPU by tests/runtime/test_kv_capacity.py), SGLang at
# verl 0.4's pin (G11, G13, 2025-06). A plan's engine version left out is one of these only where its verl release
# allows it (`default_engine_version`).
FITTED_VLLM = "0.11.0"
FITTED_SGLANG = "0.4.6.post5"
# TensorRT-LLM: the lowest verl's `trtllm` extra allows (setup.py TRTLLM_REQUIRES "tensorrt-llm>=1.2.0rc6" at
# v0.7.1, v0.8.0, v0.9.0 and the 0.8.0.dev main of /work/wt/import-verl-main; docker/Dockerfile.stable.trtllm's base
# image is release:1.2.0rc6 on that main). Its KV sizing was read in tensorrt_llm/_torch/pyexecutor/_util.py
# (KvCacheCreator.estimate_max_tokens / _cal_max_tokens) as the code index holds it, not at a pinned tag.
FITTED_TRTLLM = "1.2.0rc6"
FITTED_ENGINE_VERSIONS: dict[str, str] = {"vllm": FITTED_VLLM, "sglang": FITTED_SGLANG, "trtllm": FITTED_TRTLLM}

# What each verl release's `vllm` and `sglang` extras allow (its wheel's Requires-Dist, read 2026-11-25 from PyPI):
# (lowest, highest), both inclusive, None where open. A release between two of these has the older one's pins.
# `trtllm` (TensorRT-LLM) is an extra from verl 0.7.1 (setup.py TRTLLM_REQUIRES, read at the tags v0.7.1, v0.8.0 and
# v0.9.0 of verl-project/verl; 0.9.1's is carried from 0.9.0, not read); a release without it has no entry.
VERL_ENGINE_PINS: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "0.3.0.post1": {"vllm": (None, "0.8.2"), "sglang": ("0.4.4.post3", "0.4.4.post3")},
    "0.4.0": {"vllm": (None, "0.8.5"), "sglang": ("0.4.6.post5", "0.4.6.post5")},
    "0.5.0": {"vllm": ("0.7.3", "0.8.5"), "sglang": ("0.4.6.post5", "0.4.6.post5")},
    "0.6.0": {"vllm": ("0.7.3", "0.9.1"), "sglang": ("0.5.2", "0.5.2")},
    "0.6.1": {"vllm": ("0.8.5", "0.11.0"), "sglang": ("0.5.5", "0.5.5")},
    "0.7.0": {"vllm": ("0.8.5", "0.12.0"), "sglang": ("0.5.6", "0.5.6")},
    "0.7.1": {"vllm": ("0.8.5", "0.12.0"), "sglang": ("0.5.6", "0.5.6"), "trtllm": (FITTED_TRTLLM, None)},
    "0.8.0": {"vllm": ("0.8.5", "0.12.0"), "sglang": ("0.5.8", "0.5.8"), "trtllm": (FITTED_TRTLLM, None)},
    "0.9.0": {"vllm": ("0.18.0", None), "sglang": ("0.5.8", "0.5.8"), "trtllm": (FITTED_TRTLLM, None)},
    "0.9.1": {"vllm": ("0.24.0", "0.24.0"), "sglang": ("0.5.12", "0.5.12"), "trtllm": (FITTED_TRTLLM, None)},
}


# 0.4.1, v0.3.0.post1, 0.8.0.dev, 0.5.0rc1, 0.11.1+cu128: the release numbers, then any pre/post/dev/local tail.
# A release number has at most six digits (calendar versions such as 2024.10 included); a longer run is no version,
# and int() of a 4,300-digit run raises.
_VERSION = re.compile(r"v?(\d{1,6})(?:\.(\d{1,6}))?(?:\.(\d{1,6}))?(?:[.\-+]?(?:post|dev|rc|a|b|\+)[\w.+-]*)?")


@functools.lru_cache(maxsize=256)  # the solver's inner loop asks about the same few versions thousands of times
def parse_version(text: str, where: str = "stack.verl") -> Version:
    """`0.4.1` -> (0, 4, 1); a suffix (post1, dev, rc1, +cu128) counts as its release. A PlanError naming
    `where` for anything else."""
    match = _VERSION.fullmatch(str(text).strip())
    if match is None:
        raise PlanError(field=where, message=f"{shorten(str(text))!r} is not a version.",
                        fix=f"write it as major.minor.patch, e.g. {where} 0.4.1" if where.startswith("--")
                        else f'write it as major.minor.patch, e.g. {where} = "0.4.1"')
    major, minor, patch = (int(part) if part else 0 for part in match.groups())
    return major, minor, patch


def in_range(version: str, since: str | None, before: str | None) -> bool:
    """since <= version < before (an end left out: open)."""
    release = parse_version(version)
    return ((since is None or release >= parse_version(since))
            and (before is None or release < parse_version(before)))


def _version_check(instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None:
        parse_version(value, f"stack.{attribute.name}")


@frozen(kw_only=True)
class StackSection:
    """The versions a plan targets (plan.toml `[stack]`). An engine's version left out is its default; only the
    plan's own rollout engine may be given one (checked by `Plan`)."""

    verl: str = field(default=DEFAULT_VERL, validator=_version_check)
    vllm: str | None = field(default=None, validator=_version_check)
    sglang: str | None = field(default=None, validator=_version_check)
    trtllm: str | None = field(default=None, validator=_version_check)
    # vLLM's engine where the script chose it (VLLM_USE_V1, an attention backend V1 lacks); None: the one the
    # vLLM version runs by default (`vllm_engine_of`).
    vllm_engine: VllmEngine | None = field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(("v0", "v1"))))
    # The oldest verl release an imported script's keys allow (`verl` is the newest): set by `import verl` where
    # the evidence leaves a range, so that validate can say where the verdict differs across it. None: not a range.
    verl_oldest: str | None = field(default=None, validator=_version_check)

    def __attrs_post_init__(self) -> None:
        if self.verl_oldest is not None and parse_version(self.verl_oldest) > parse_version(self.verl):
            raise PlanError(field="stack.verl_oldest", message=f"is {self.verl_oldest!r}, newer than stack.verl "
                            f"{self.verl!r}.", fix="set stack.verl_oldest to a release not after stack.verl, or "
                            "remove it")
        if self.vllm_engine == "v0" and parse_version(self.version_of("vllm")) >= parse_version(VLLM_V0_REMOVED):
            raise PlanError(field="stack.vllm_engine", message=f'is "v0", but vLLM {self.version_of("vllm")} has '
                            f"no V0 engine (removed in {VLLM_V0_REMOVED}).",
                            fix=f'set stack.vllm to a release before {VLLM_V0_REMOVED} (verl 0.8.0 or older '
                            'installs one), or remove stack.vllm_engine')

    def version_of(self, package: Package) -> str:
        """The version text of `package` on this stack (an engine left out: what its verl release installs)."""
        given = getattr(self, package)
        if given is not None or package == "verl":
            return given
        return default_engine_version(self.verl, package)

    def resolved(self, engine: str) -> dict[str, str]:
        """The stack as shown (`--json`, `--version`): verl and the plan's rollout engine, each with its version."""
        return {"verl": self.verl, engine: self.version_of(engine)}  # type: ignore[arg-type]

    def describe(self, engine: str) -> str:
        text = ", ".join(f"{name} {version}" for name, version in self.resolved(engine).items())
        if engine == "vllm" and self.vllm_engine is not None:
            text += f" ({self.vllm_engine.upper()} engine)"
        if self.verl_oldest is not None and self.verl_oldest != self.verl:
            text += f"; the script fits verl {self.verl_oldest} to {self.verl}"
        return text


DEFAULT_STACK = StackSection()


def engine_pins(verl: str, engine: str) -> tuple[str | None, str | None]:
    """The (lowest, highest) `engine` version verl release `verl` installs with (VERL_ENGINE_PINS: the newest
    listed release not after it; one older than all: the oldest's)."""
    release = parse_version(verl)
    listed = sorted(VERL_ENGINE_PINS, key=parse_version)
    known = [name for name in listed if parse_version(name) <= release] or listed[:1]
    return VERL_ENGINE_PINS[known[-1]].get(engine, (None, None))


def default_engine_version(verl: str, engine: str) -> str:
    """The engine version a plan on verl `verl` gets when it names none: the version rlplan's terms were read at
    where that verl allows it (they then hold as read), else the newest the release allows (its lowest where the
    range is open above): a verl that refuses vLLM 0.11 is not run with it."""
    fitted = FITTED_ENGINE_VERSIONS[engine]
    lowest, highest = engine_pins(verl, engine)
    if in_range(fitted, lowest, None) and (highest is None or parse_version(fitted) <= parse_version(highest)):
        return fitted
    return highest or lowest or fitted  # no table row is open at both ends


# The default stack's engines, as `rlplan --version` prints them.
DEFAULT_VLLM = default_engine_version(DEFAULT_VERL, "vllm")
DEFAULT_SGLANG = default_engine_version(DEFAULT_VERL, "sglang")


def check_engine(stack: StackSection, engine: str) -> None:
    """The stack names a version only for the engine the plan rolls out with."""
    if engine != "vllm" and stack.vllm_engine is not None:
        raise PlanError(field="stack.vllm_engine", message=f"is {stack.vllm_engine!r}, but the plan rolls out with "
                        f"{engine}.", fix="remove stack.vllm_engine")
    for other in (name for name in FITTED_ENGINE_VERSIONS if name != engine):
        if getattr(stack, other) is not None:
            raise PlanError(field=f"stack.{other}",
                            message=f"is {getattr(stack, other)!r}, but the plan rolls out with {engine}.",
                            fix=f"remove stack.{other}, or set stack.{engine} (or rollout.name = \"{other}\")")


def default_stack_text() -> str:
    """What `rlplan --version` prints under the package version."""
    return (f"target stack by default (what the rules are checked against): verl {DEFAULT_VERL}, "
            f"vLLM {DEFAULT_VLLM} or SGLang {DEFAULT_SGLANG} (the versions verl {DEFAULT_VERL} installs; rollout "
            f"terms read at vLLM {FITTED_VLLM} and SGLang {FITTED_SGLANG})")


# --- behaviours that hold for some versions -----------------------------------------------------


@frozen(kw_only=True)
class Behaviour:
    """One thing verl (or the engine) does only in some versions: `since` inclusive, `before` exclusive."""

    name: str
    package: Package
    code_path: str
    summary: str
    since: str | None = None
    before: str | None = None
    # A plan key whose default the behaviour sets (value and all), for plans built from incomplete input.
    default: tuple[str, Any] | None = None
    # True: the behaviour holds outside [since, before) (a key verl added in `since` and removed in `before`).
    outside: bool = False
    # (key, value, since, before): it also holds on those releases where the script sets key=value (kept as
    # passthrough), e.g. trainer.use_legacy_worker_impl=disable selecting the engine worker in verl 0.7.x.
    opt_in: tuple[str, str, str, str] | None = None
    # (key, values, since, before): it does not hold on those releases where key is one of values (the script's, or
    # the default of the verl source tree the import runs in), e.g. LEGACY_WORKER_SWITCH on verl's 0.8.0.dev main.
    opt_out: tuple[str, tuple[str, ...], str, str] | None = None

    def opted_in(self, version: str, passthrough: Mapping[str, str]) -> bool:
        if self.opt_in is None:
            return False
        key, value, since, before = self.opt_in
        written = _written(passthrough, key)
        return written is not None and written == value and in_range(version, since, before)

    def opted_out(self, version: str, passthrough: Mapping[str, str]) -> bool:
        if self.opt_out is None:
            return False
        key, values, since, before = self.opt_out
        written = _written(passthrough, key)
        return written is not None and written in values and in_range(version, since, before)

    def holds_for(self, version: str) -> bool:
        return in_range(version, self.since, self.before) != self.outside

    @property
    def versions(self) -> str:
        if self.outside:
            return f"{self.package} < {self.since} or >= {self.before}"
        if self.since and self.before:
            return f"{self.package} {self.since} to before {self.before}"
        return f"{self.package} >= {self.since}" if self.since else f"{self.package} < {self.before}"


def _written(passthrough: Mapping[str, str], key: str) -> str | None:
    """The value the plan's passthrough gives `key` (as `key`, `+key` or `++key`), unquoted."""
    written = next((passthrough[p + key] for p in ("++", "+", "") if p + key in passthrough), None)
    return None if written is None else written.strip("'\"")


def holds(behaviour: Behaviour, stack: StackSection, engine: str = "vllm",
          passthrough: Mapping[str, str] | None = None) -> bool:
    """Whether `behaviour` holds on `stack` (an engine's behaviour holds only for a plan rolling out with it);
    with the plan's `passthrough`, also where the script opts in to it (`Behaviour.opt_in`), and not where it opts
    out (`Behaviour.opt_out`)."""
    if behaviour.package == "verl":
        written = passthrough or {}
        return ((behaviour.holds_for(stack.verl) and not behaviour.opted_out(stack.verl, written))
                or behaviour.opted_in(stack.verl, written))
    return behaviour.package == engine and behaviour.holds_for(stack.version_of(behaviour.package))


ENTROPY_COEFF_DEFAULT_0001 = Behaviour(
    name="entropy_coeff_default_0001", package="verl", before="0.4.0",
    code_path="verl/trainer/config/ppo_trainer.yaml actor.entropy_coeff (0 from PR #1770, v0.4.0)",
    summary="actor.entropy_coeff defaults to 0.001: the entropy's buffers are on and flash-attn's in-place "
            "cross-entropy backward is off", default=("actor.entropy_coeff", 0.001))
REFERENCE_ALWAYS_RUNS = Behaviour(
    name="reference_always_runs", package="verl", before="0.4.0",
    code_path="verl/trainer/main_ppo.py: role_worker_mapping always holds Role.RefPolicy up to v0.3.0.post1, so "
              "ray_trainer's use_reference_policy is always true; from v0.4.0 only with use_kl_loss or "
              "use_kl_in_reward (PR #644)",
    summary="the reference model is built and its log-prob pass runs every step, with or without a KL term")
ENTROPY_IN_EVERY_PASS = Behaviour(
    name="entropy_in_every_pass", package="verl", before="0.4.0",
    code_path="verl/workers/actor/dp_actor.py _forward_micro_batch computes entropy_from_logits in every pass up "
              "to v0.3.0.post1 (the reference's and every update's, whatever entropy_coeff); from v0.4.0 "
              "(PR #1100) only where calculate_entropy asks",
    summary="every log-prob pass and every update computes the entropy over the vocabulary")
REWARD_TIMED_IN_ADV = Behaviour(
    name="reward_timed_in_adv", package="verl", before="0.4.0",
    code_path="verl/trainer/ppo/ray_trainer.py fit: the reward function runs inside _timer('adv') up to "
              "v0.3.0.post1; its own `reward` timer from v0.4.0",
    summary="the rule reward's time is part of timing_s/adv")
EAGER_ROLLOUT_DEFAULT = Behaviour(
    name="eager_rollout_default", package="verl", before="0.6.0",
    code_path="ppo_trainer.yaml, then verl/trainer/config/rollout/rollout.yaml rollout.enforce_eager "
              "(True in v0.5.0, False from v0.6.0)",
    summary="rollout.enforce_eager defaults to true: no CUDA-graph pool", default=("rollout.enforce_eager", True))
UNSTAGED_WAKE_UP = Behaviour(
    name="unstaged_wake_up", package="verl", before="0.4.1",
    code_path="verl/workers/sharding_manager/fsdp_vllm.py __enter__ (rollout.multi_stage_wake_up from v0.4.1)",
    summary="the rollout's weights and KV cache wake together, before the weight sync (no staged wake-up)",
    default=("rollout.multi_stage_wake_up", False))
REF_LOADS_BF16 = Behaviour(
    name="ref_loads_bf16", package="verl", before="0.6.0",
    code_path="verl/workers/fsdp_workers.py _build_model_optimizer: without fsdp_config.model_dtype (in the YAML "
              "from v0.6.0, fp32) the actor loads fp32 and the reference bf16",
    summary="the reference model's FSDP shards are bf16", default=("ref.model_dtype", "bf16"))
VALIDATES_BEFORE_TRAIN = Behaviour(
    name="validates_before_train", package="verl", before="0.4.0",
    code_path="verl/trainer/ppo/ray_trainer.py fit: trainer.get('val_before_train', True) (in the YAML from v0.4.0)",
    summary="verl validates before the first step", default=("trainer.val_before_train", True))
# verl's main between the v0.7.x branch and v0.8.0 (verl/version/version "0.8.0.dev") still had
# trainer.use_legacy_worker_impl, default auto, and main_ppo.py add_actor_rollout_worker built the engine worker only
# for "disable" (read in a main checkout of January 2026); v0.8.0 removed the key and always builds the engine worker.
# So on a 0.8.0.dev tree, auto or enable (the tree's default, which the import reads) keeps the legacy worker.
LEGACY_WORKER_SWITCH = ("trainer.use_legacy_worker_impl", ("auto", "enable"), "0.8.0", "0.8.1")
ENGINE_WORKER = Behaviour(
    name="engine_worker", package="verl", since="0.8.0",
    opt_out=LEGACY_WORKER_SWITCH,
    opt_in=("trainer.use_legacy_worker_impl", "disable", "0.7.0", "0.8.0"),
    code_path="verl/trainer/main_ppo.py: the engine worker (verl/workers/engine_workers.py) is the default from "
              "v0.8.0; in v0.7.x only with trainer.use_legacy_worker_impl=disable",
    summary="the engine worker runs the actor, and asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz")
ENGINE_MICRO_SPLIT_ASSERT = Behaviour(
    name="engine_micro_split_assert", package="verl", since="0.8.0",
    opt_out=LEGACY_WORKER_SWITCH,
    opt_in=("trainer.use_legacy_worker_impl", "disable", "0.7.1", "0.8.0"),
    code_path="verl/workers/engine/utils.py prepare_micro_batches: assert total_data_size % (force_group_size * "
              "micro_batch_size_per_gpu) == 0 (from v0.7.1; v0.7.0 chunks without it), reached through the engine "
              "worker (the default from v0.8.0, in v0.7.x with trainer.use_legacy_worker_impl=disable)",
    summary="the engine worker asserts that a fixed micro batch divides each rank's batch")
MICRO_OUTPUTS_HELD_TO_MINI_END = Behaviour(
    name="micro_outputs_held_to_mini_end", package="verl", since="0.8.0", before="0.9.0",
    opt_out=LEGACY_WORKER_SWITCH,
    code_path="verl/workers/engine/fsdp/transformer_impl.py FSDPEngine.forward_backward_batch: output_lst keeps "
              "each micro batch's model_output (log_probs, entropy) until the mini batch ends (PR #6984, v0.9.0)",
    summary="the update holds every earlier micro batch's grad-connected log-probs and entropy until the mini "
            "batch ends: update memory grows with the mini batch's tokens")
SOFT_TOKEN_BUDGET = Behaviour(
    name="soft_token_budget", package="verl", before="0.9.1",
    code_path="verl/utils/seqlen_balancing.py rearrange_micro_batches: ceil(tokens / max_token_len) micro batches "
              "balanced by Karmarkar-Karp (PR #7553, 2026-08-25, after v0.9.0's 2026-08-14 branch)",
    summary="max_token_len is not a hard cap: one micro batch may hold more tokens than the budget")
# --- rules that hold only in some releases (read in the 0.3.0.post1 ... 0.9.1 wheels' sources) ------------------
MEGATRON_MICRO_SPLIT_ASSERT = Behaviour(
    name="megatron_micro_split_assert", package="verl", before="0.4.0",
    code_path="verl/workers/actor/megatron_actor.py forward_backward_batch: split_dict_tensor_into_batches, which "
              "asserts batch % micro_batch_size == 0 (verl/utils/torch_functional.py line 223 at v0.3.0.post1); from "
              "v0.4.0 megatron_actor.py / megatron_critic.py take mini_batch.batch.split(micro_batch_size), a short "
              "last micro batch (read at v0.4.0-v0.7.0 and main)",
    summary="the legacy Megatron workers assert that a fixed micro batch divides the mini batch per GPU")
PROMPTS_DISPATCHED_BEFORE_REPEAT = Behaviour(
    name="prompts_dispatched_before_repeat", package="verl", before="0.5.0",
    code_path="verl/trainer/ppo/ray_trainer.py fit: actor_rollout_wg.generate_sequences(gen_batch) on the "
              "train_batch_size prompts, repeated n times only after it (v0.3.0.post1 lines 817/838, v0.4.0 1011/1035, "
              "v0.4.1 983/1009); Dispatch.DP_COMPUTE_PROTO chunks them with verl/protocol.py DataProto.chunk's "
              "equal-chunk assert (v0.3.0.post1 line 499); from v0.5.0 the repeated batch is dispatched",
    summary="the sync rollout's prompts are split over the GPUs before they are repeated n times")
REAL_BATCH_CHECKED_UNDER_DYNAMIC_BSZ = Behaviour(
    name="real_batch_checked_under_dynamic_bsz", package="verl", before="0.6.0",
    code_path="verl/trainer/ppo/ray_trainer.py RayPPOTrainer._validate_config asserts real_train_batch_size % "
              "n_gpus == 0 whatever use_dynamic_bsz says (v0.3.0.post1 lines 302-304, v0.4.0 431-434, v0.5.0 "
              "414-427); verl/utils/config.py validate_config gates it on use_dynamic_bsz from v0.6.0",
    summary="train_batch_size x n must divide by the GPUs even with dynamic batch size")
AGENT_LOOP = Behaviour(
    name="agent_loop", package="verl", since="0.5.0",
    code_path="verl/experimental/agent_loop/agent_loop.py AgentLoopManager.generate_sequences: "
              "prompts.chunk(len(self.agent_loop_workers)), and verl/protocol.py DataProto.chunk asserts "
              "len(self) % chunks == 0 (no agent loop before v0.5.0)",
    summary="an async rollout goes through verl's agent loop, which splits the batch evenly over its workers")
ASYNC_ROLLOUT_DEFAULT = Behaviour(
    name="async_rollout_default", package="verl", since="0.7.0",
    code_path="verl/trainer/config/rollout/rollout.yaml mode (sync up to v0.6.1, async from v0.7.0, where "
              "RolloutConfig.__post_init__ refuses sync); ray_trainer.py uses the agent loop only for async",
    summary="the rollout is async (the agent loop) whatever the script says")
ASYNC_RECIPES_IN_PACKAGE = Behaviour(
    name="async_recipes_in_package", package="verl", since="0.8.0",
    code_path="recipe/one_step_off_policy/main_ppo.py and recipe/fully_async_policy/fully_async_main.py (v0.5.0-"
              "v0.7.0), verl/experimental/one_step_off_policy/main_ppo.py and verl/experimental/fully_async_policy/"
              "fully_async_main.py on main at 0.8.0.dev (read January 2026; 0.7.1 not read, taken as recipe/)",
    summary="the one-step-off and fully async recipes are modules of the verl package, not of recipe/")
SPIN_SPPO_RECIPES = Behaviour(
    name="spin_sppo_recipes", package="verl", since="0.4.1", before="0.8.0",
    code_path="recipe/spin/main_spin.py and recipe/sppo/main_sppo.py in the v0.4.1, v0.5.0, v0.6.1 and v0.7.0 "
              "checkouts; absent from v0.3.0.post1 and from main at 0.8.0.dev (recipe/ gone); 0.4.0 and 0.7.1 not read",
    summary="verl ships the SPIN and SPPO recipes (plan.RECIPES) under recipe/")
MODEL_MTP = Behaviour(
    name="model_mtp", package="verl", since="0.8.0",
    code_path="verl/trainer/config/model/hf_model.yaml `mtp` and verl/workers/config/model.py MtpConfig on main at "
              "0.8.0.dev; absent from v0.7.0 (0.7.1 not read, taken as absent)",
    summary="verl's model.mtp switches exist (the Megatron workers keep and train the checkpoint's MTP layers)")
MEGATRON_GRAD_OFFLOAD_ABSENT = Behaviour(
    name="megatron_grad_offload_absent", package="verl", since="0.4.0", before="0.9.1", outside=True,
    code_path="verl/trainer/config/ppo_megatron_trainer.yaml actor.megatron.grad_offload (v0.4.0-v0.4.1), "
              "engine/megatron.yaml and verl/workers/config/engine.py McoreEngineConfig.grad_offload (v0.5.0-v0.9.0); "
              "absent from v0.9.1 (param_offload frees the gradient buffers) and before v0.4.0 (v0.3.0.post1's "
              "megatron_workers.py reads actor.grad_offload, outside actor.megatron)",
    summary="verl's Megatron engine config has no megatron.grad_offload: hydra refuses the override")
MEGATRON_PP_STAGES_LOADED_FOR_ROLLOUT = Behaviour(
    name="megatron_pp_stages_loaded_for_rollout", package="verl", before="0.4.0",
    code_path="verl/workers/sharding_manager/megatron_vllm.py AllGatherPPModel: every rank builds the other pipeline "
              "stages' models (bf16, no DDP) and offloads them to the host; megatron_workers.py _build_rollout calls "
              "hybrid_engine.load_params_to_cuda() and allgather_params() before vLLMRollout is built, and "
              "MegatronVLLMShardingManager.__enter__ / __exit__ load and offload them around each generation (read at "
              "v0.3.0.rc0 and v0.3.0.post1; v0.4.0's megatron_workers.py no longer uses AllGatherPPModel)",
    summary="the legacy Megatron actor holds every pipeline stage's weights on each GPU while the engine is built "
            "and runs")
MEGATRON_LOG_PROB_CLONES_LOGITS = Behaviour(
    name="megatron_log_prob_clones_logits", package="verl", since="0.6.0",
    code_path="verl/workers/actor/megatron_actor.py forward_backward_batch's logits_processor `logits_bak = "
              "logits.clone()` before vocab_parallel_entropy (read at v0.6.0, v0.6.1, v0.7.0 and main at 0.8.0.dev; "
              "the engine worker's verl/workers/engine/megatron/transformer_impl.py alike at v0.6.1-main); v0.4.0, "
              "v0.4.1 and v0.5.0 compute the entropy and then the log-probs on the logits themselves",
    summary="verl's Megatron log-prob pass with the entropy clones the vocabulary-parallel logits first")
# The worker call's DataProto (memory/dataproto.py). Read at the tags: v0.3.0.post1 fsdp_workers.py update_actor /
# compute_log_prob / compute_ref_log_prob / compute_values / update_critic `data = data.to(torch.cuda.current_device())`
# (lines 439, 529, 561, 808, 831), megatron_workers.py `data.batch = data.batch.cuda()` (update_actor, 372) and
# `data = data.to('cuda')` (424, 444, 637, 645); v0.4.0 alike (fsdp_workers.py 571, 652, 695, 1018, 1041;
# megatron_workers.py 419, 497, 519, 743, 755); v0.4.1 fsdp_workers.py 696, 740, 1084, 1108 (update_actor: 606 moves
# it to "cpu"), megatron_workers.py `data.batch = data.batch.to(get_device_name())` 444 and 520, 543, 775, 788;
# v0.5.0 fsdp_workers.py 676, 772, 816, 1209, 1233, megatron_workers.py 507, 590, 613, 924, 937 (and commit 9f4161e2,
# 0.5.0.dev, megatron_workers.py 623). The whole DP share stays referenced by `data` in the worker's frame until the
# call returns (the actors' update_policy / compute_log_prob select and split views of it). v0.6.0 removed the moves
# from the FSDP worker (update_actor / compute_ref_log_prob / compute_values / update_critic move it to "cpu": "data
# will to device with each micro batch", lines 858, 1006, 1461, 1480) and from the Megatron actor, ref and log-prob
# (617-760: no move); the Megatron critic's compute_values / update_critic keep `data = data.to(get_device_id())` at
# v0.6.0 (1034, 1047), v0.7.0 (1217, 1230) and v0.7.1 (1225, 1238); v0.8.0 has no megatron_workers.py.
WORKER_HOLDS_BATCH_ON_GPU = Behaviour(
    name="worker_holds_batch_on_gpu", package="verl", before="0.6.0",
    code_path="verl/workers/fsdp_workers.py and megatron_workers.py update_actor, compute_log_prob, "
              "compute_ref_log_prob, compute_values, update_critic: data.to(device) of the whole call's batch "
              "(v0.3.0.post1-v0.5.0; gone at v0.6.0 but for the Megatron critic, MEGATRON_CRITIC_HOLDS_BATCH_ON_GPU)",
    summary="each trainer pass holds the rank's whole share of the step's batch on the GPU")
FSDP_ACTOR_UPDATE_BATCH_ON_HOST = Behaviour(
    name="fsdp_actor_update_batch_on_host", package="verl", since="0.4.1", before="0.5.0",
    code_path="verl/workers/fsdp_workers.py update_actor line 606 at v0.4.1: data.to('cpu') ('data will to device "
              "with each micro batch on actor.update_policy'); v0.5.0 line 676 moves it to the GPU again",
    summary="the FSDP actor's update keeps the batch in host memory, moving one micro batch at a time")
MEGATRON_CRITIC_HOLDS_BATCH_ON_GPU = Behaviour(
    name="megatron_critic_holds_batch_on_gpu", package="verl", before="0.8.0",
    opt_out=("trainer.use_legacy_worker_impl", ("disable",), "0.7.1", "0.8.0"),
    code_path="verl/workers/megatron_workers.py compute_values / update_critic: data = data.to(get_device_id()) "
              "(v0.3.0.post1-v0.7.1; no megatron_workers.py at v0.8.0); verl/trainer/main_ppo.py add_critic_worker "
              "builds the Megatron critic from it at v0.6.0-v0.7.0 whatever trainer.use_legacy_worker_impl says, "
              "and at v0.7.1 from engine_workers.py TrainingWorker (no such move) for 'disable'",
    summary="the legacy Megatron critic holds the rank's whole share of the step's batch on the GPU in its passes")
LEN_FROM_SEQUENCES = Behaviour(
    name="max_model_len_from_sequences", package="verl", before="0.7.0",
    code_path="verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py (and vllm_rollout.py) __init__: "
              "max_model_len = config.max_model_len or prompt_length + response_length; v0.6.x "
              "vllm_async_server.py sets max_model_len = prompt_length + response_length outright",
    summary="vLLM gets prompt + response as max_model_len where rollout.max_model_len is unset")
ROPE_SCALED_SKIPS_LEN_ASSERT = Behaviour(
    name="rope_scaled_skips_len_assert", package="verl", since="0.4.0", before="0.5.0",
    code_path="verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py vLLMRollout.__init__ (v0.4.0 and v0.4.1 lines "
              "112-124; vllm_rollout.py line 100-102 alike; PR #1522): the assert max_position_embeddings >= "
              "prompt_length + response_length runs only `if not rope_scaling_config` (getattr(model_hf_config, "
              "'rope_scaling', None)); v0.3.0.post1 line 97 asserts it for every model. SGLang's "
              "sglang_rollout.py _verify_config (v0.4.1 line 358) asserts max_position_embeddings >= max_model_len "
              "whatever rope_scaling says",
    summary="verl's vLLM rollout skips its positions assert for a model whose config has rope_scaling (vLLM's own "
            "max_model_len check stays)")
ROPE_SCALED_LEN_ASSERT = Behaviour(
    name="rope_scaled_len_assert", package="verl", since="0.5.0", before="0.7.0",
    code_path="verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py vLLMRollout.__init__ (v0.5.0 lines 105-137, "
              "v0.6.1 lines 162-194; PR #737) and sglang_rollout/sglang_rollout.py _verify_config (v0.5.0 lines "
              "389-407, v0.6.1 379-397): with rope_scaling, assert max_position_embeddings * "
              "rope_scaling.get('factor', 1.0) >= prompt_length + response_length; from v0.7.0 no such assert "
              "(vllm_rollout_spmd.py gone, vllm_async_server.py starts vLLM at max_position_embeddings, unscaled)",
    summary="verl's rollout holds prompt + response to max_position_embeddings x rope_scaling.factor for a "
            "rope-scaled model")
ROLLOUT_HF_MODEL_CONFIG = Behaviour(
    name="rollout_hf_model_config", package="verl", since="0.6.0",
    code_path="verl/workers/config/model.py HFModelConfig.__post_init__ (v0.6.0 line 136, v0.6.1 lines 137-142, "
              "v0.7.0 144-149, main 187-192): the HF config takes override_config['model_config'] where the script "
              "sets it, else override_config itself; both workers build the rollout from it (fsdp_workers.py "
              "v0.6.0 line 569, megatron_workers.py v0.6.0 lines 396-428). Before v0.6.0 the rollout gets the "
              "trainer's HF config: FSDP applies override_config's own keys (fsdp_workers.py v0.5.0 lines 263-269), "
              "Megatron only override_config.model_config's (single_controller/base/megatron/worker.py "
              "_init_hf_config_and_tf_config, v0.4.1 line 85, v0.5.0 line 86)",
    summary="the rollout's HF config reads override_config.model_config.* where the script sets it, else "
            "override_config.*, on either backend")
OVERRIDE_CONFIG_RECURSES = Behaviour(
    name="override_config_recurses", package="verl", since="0.4.0",
    code_path="verl/utils/model.py update_model_config (v0.4.0 and v0.4.1 lines 52-62, v0.5.0 54-64, v0.6.1 59-69, "
              "v0.7.0 and main 61-71): a dict value recurses, `update_model_config(getattr(module_config, key), "
              "val)`, then `setattr` on what getattr found; v0.3.0.post1 (lines 42-44) sets each key whole",
    summary="verl applies a nested override_config key by getattr on the HF config and setattr on what it finds: "
            "into a dict (rope_scaling) or a missing attribute that raises AttributeError")
LEN_FROM_MODEL_ALWAYS = Behaviour(
    name="max_model_len_from_model_always", package="verl", since="0.7.0", before="0.7.1",
    code_path="v0.7.0 verl/workers/rollout/vllm_rollout/vllm_async_server.py vLLMHttpServer.__init__: "
              "self.config.max_model_len = self.model_config.hf_config.max_position_embeddings",
    summary="vLLM gets the model's max_position_embeddings as max_model_len, whatever rollout.max_model_len says")
CHUNKED_PREFILL_NEEDS_MODEL_LEN = Behaviour(
    name="chunked_prefill_needs_model_len", package="verl", before="0.7.0",
    code_path="verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py __init__: raises ValueError('Enable chunked "
              "prefill, max_num_batched_tokens is smaller than max_model_len') when enable_chunked_prefill and "
              "max_num_batched_tokens < max_model_len (v0.3.0.post1-v0.6.1; no such file from v0.7.0)",
    summary="verl's sync vLLM rollout refuses max_num_batched_tokens < max_model_len with chunked prefill on")
BATCHED_TOKENS_RAISED = Behaviour(
    name="batched_tokens_raised", package="verl", since="0.9.1",
    code_path="verl/workers/rollout/vllm_rollout/vllm_async_server.py _validate_configs: without chunked "
              "prefill, max_num_batched_tokens < max_model_len is raised to max_model_len with a warning",
    summary="verl raises max_num_batched_tokens to max_model_len itself when chunked prefill is off")
VLLM_V1_FORCES_CHUNKED_PREFILL = Behaviour(
    name="vllm_v1_forces_chunked_prefill", package="vllm", before="0.11.1",
    code_path="vllm/engine/arg_utils.py EngineArgs._set_default_args_v1 (0.8.x-0.10.x) and _set_default_args "
              "(0.11.0): `self.enable_chunked_prefill = True` for every generating model on the V1 engine, whatever "
              "was passed (\"V1 always uses chunked prefills\"); 0.32 keeps an explicit False (`if "
              "self.enable_chunked_prefill is None`). Between 0.11.1 and 0.31 not read: the rule stays strict there",
    summary="vLLM's V1 engine turns chunked prefill on itself: enable_chunked_prefill=False is overridden, so "
            "max_num_batched_tokens below max_model_len is no error")
LORA_RANK_UNROUNDED = Behaviour(
    name="lora_rank_unrounded", package="verl", before="0.6.1",
    code_path="verl/workers/fsdp_workers.py _build_rollout (v0.4.0-v0.5.0: lora_kwargs max_lora_rank=self._lora_rank) "
              "and vllm_rollout_spmd.py (v0.6.0: max_lora_rank=model_config.lora_rank); from v0.6.1 "
              "vllm_rollout/utils.py get_vllm_max_lora_rank rounds it up to a rank vLLM takes",
    summary="vLLM gets model.lora_rank itself as max_lora_rank, and refuses a rank outside its set")
# --- the rollout engine's KV sizing ----------------------------------------------------------------------------
VLLM_V0_ENGINE = Behaviour(
    name="vllm_v0_engine", package="vllm", before="0.8.0",
    code_path="vllm/envs.py VLLM_USE_V1 (default '0' in 0.7.3, '1' from 0.8.0); an attention backend V1 "
              "lacks (XFORMERS) falls back to V0 up to 0.10.x; V0 is gone from 0.11.0",
    summary="vLLM's V0 engine by default (vllm/worker/worker.py)")
VLLM_V0_REMOVED = "0.11.0"
# The level verl puts vLLM to sleep at (read in volcengine/verl's tags). v0.3.0.post1, v0.4.1 and v0.5.0 always call
# sleep(level=1): verl/workers/sharding_manager/fsdp_vllm.py __exit__ (v0.5.0 line 240, v0.4.1 215, v0.3.0.post1 123),
# megatron_vllm.py (v0.5.0 191, v0.4.1 173), vllm_rollout/vllm_rollout_spmd.py (v0.5.0 189). From v0.6.0
# verl/third_party/vllm/__init__.py (lines 33-49, unchanged to v0.7.0 and 0.8.0.dev main) sets VLLM_SLEEP_LEVEL = 2 for
# vLLM >= 0.8.5 (1 below it, and on NPU), which the sharding managers and the rollout use, save that the rollout keeps
# level 1 with layered_summon (vllm_rollout_spmd.py v0.6.0 line 106 and 495, v0.6.1 534; vllm_rollout.py v0.7.0 131).
SLEEP_LEVEL_TWO = Behaviour(
    name="sleep_level_two", package="verl", since="0.6.0",
    code_path="verl/third_party/vllm/__init__.py VLLM_SLEEP_LEVEL (from v0.6.0; up to v0.5.0 the sharding managers "
              "and vllm_rollout_spmd.py call inference_engine.sleep(level=1))",
    summary="verl can put vLLM to sleep at level 2, which discards the weights instead of copying them to host")
VLLM_SLEEP_LEVEL_TWO = Behaviour(
    name="vllm_sleep_level_two", package="vllm", since="0.8.5",
    code_path="verl/third_party/vllm/__init__.py: VLLM_SLEEP_LEVEL = 2 only where vs.parse(vllm) >= 0.8.5",
    summary="verl from v0.6.0 sleeps vLLM at level 2 only on vLLM 0.8.5 or newer")


def verl_sleep_level(stack: StackSection, lora_enabled: bool, layered_summon: bool) -> Literal[1, 2]:
    """The level verl sleeps vLLM at on `stack`: 1 up to verl 0.5 and under vLLM 0.8.5 (SLEEP_LEVEL_TWO,
    VLLM_SLEEP_LEVEL_TWO); from verl 0.6.0 on vLLM 0.8.5+, 2 unless only adapters (LoRA; verl 0.8's engine worker
    sets level 1 for an adapter-only sync, engine_workers.py) or layers (layered_summon) are pushed back."""
    if lora_enabled or layered_summon:
        return 1
    return 2 if holds(SLEEP_LEVEL_TWO, stack) and holds(VLLM_SLEEP_LEVEL_TWO, stack, "vllm") else 1


VLLM_V1_WHOLE_GPU_PROFILE = Behaviour(
    name="vllm_v1_whole_gpu_profile", package="vllm", before="0.9.1",
    code_path="vllm/v1/worker/gpu_worker.py Worker.determine_available_memory (0.7.3, 0.8.5, 0.9.0): "
              "peak_memory = memory_stats()['allocated_bytes.all.peak'] + (total - free - "
              "torch allocated); available = total x util - peak_memory; from 0.9.1 memory_profiling(init_snapshot) "
              "counts only what the instance adds",
    summary="V1 sizes its KV cache from the whole GPU: the process's torch peak (the trainer's resident state "
            "in verl's hybrid engine) and every other allocation on the device come out of util x GPU")
VLLM_V0_WHOLE_GPU_PROFILE = Behaviour(
    name="vllm_v0_whole_gpu_profile", package="vllm", since="0.6.4", before="0.6.5",
    code_path="vllm/worker/worker.py Worker.determine_num_available_blocks: 0.6.4.post1 uses the same "
              "whole-GPU peak as V1 <= 0.9.0; 0.6.3 charged free-memory drop since init, 0.6.5 on "
              "memory_profiling (what the instance adds)",
    summary="V0 0.6.4.x sizes its KV cache from the whole GPU, like V1 before 0.9.1")
# vLLM's start-up refusal (read in the sdists of each release named; docs/verl-versions.md, engine formulas). V1's
# Worker.init_device runs gc.collect() and torch.cuda.empty_cache() (the process's cached but free blocks go back),
# then MemorySnapshot(): cudaMemGetInfo's free bytes, so every allocation on the device counts: other processes, the
# CUDA contexts, and in verl's hybrid engine the trainer's state still on the GPU when it builds the engine.
VLLM_REFUSES_SHORT_FREE_MEMORY = Behaviour(
    name="vllm_refuses_short_free_memory", package="vllm", since="0.9.1",
    code_path="vllm/v1/worker/gpu_worker.py Worker.init_device: init_snapshot = MemorySnapshot(); requested_memory "
              "= total_memory x gpu_memory_utilization; `if init_snapshot.free_memory < requested_memory: raise "
              "ValueError('Free memory on device (...) on startup is less than desired GPU memory utilization "
              "(...)')` (0.9.1, 0.9.2, 0.10.0, 0.10.2, 0.11.0, 0.12.0; the snapshot after the worker's NCCL init "
              "from 0.11.0); vllm/v1/worker/utils.py request_memory, ceil(total x util), the same test and message "
              "(0.14.0, 0.17.0, 0.20.0, 0.24.0). None in 0.8.5 or 0.9.0 (init_gpu_memory only), none in V0's "
              "vllm/worker/worker.py (0.8.5-0.10.2: baseline_snapshot, no test); no tolerance, no warning-only mode, "
              "and kv_cache_memory_bytes does not skip it",
    summary="V1 refuses to start when the GPU's free memory at its start is below gpu_memory_utilization x GPU")
# vLLM's derived max_model_len (vllm/config.py _get_and_verify_max_len; vllm/config/__init__.py in 0.10.2,
# vllm/config/model.py from 0.11.0), read in the PyPI sdists of 0.6.3, 0.7.3, 0.8.0, 0.8.5, 0.9.1, 0.10.0, 0.10.2,
# 0.11.0, 0.12.0, 0.14.0, 0.17.0, 0.20.0, 0.24.0, 0.29.0, 0.30.0 (and the 0.32 the runtime installs): every release
# takes the smallest of the config's length keys, then multiplies by rope_scaling's factor unless the type is su,
# longrope or llama3, YaRN counting from original_max_position_embeddings (Architecture.vllm_derived_max_model_len).
# What moved: 0.6.3 reads `type` or `rope_type`, forces mrope's factor to 1 and asserts any other type states one
# (0.7.3 on: rope_type only, after patch_rope_scaling, factor defaulting to 1.0); 0.12.0 reads transformers v5's
# rope_parameters, per layer type, with one factor for all; 0.20.0 takes a null factor as 1.0; 0.12.0 on defaults
# an unset max_model_len of a longrope config to original_max_position_embeddings (verl always sets it). The two that
# move a limit rlplan prices are below.
VLLM_GEMMA3_POSITIONS_PRESCALED = Behaviour(
    name="vllm_gemma3_positions_prescaled", package="vllm", since="0.8.0",
    code_path="_get_and_verify_max_len: `if rope_scaling is not None and \"gemma3\" not in hf_config.model_type` "
              "(vllm/config.py 0.8.0 line 2674, 0.8.5 line 3051; config/__init__.py 0.10.2 line 2876; "
              "config/model.py 0.12.0 line 2208, 0.24.0 line 2153, 0.30.0 line 2461); not in 0.7.3 (line 2521: `if rope_scaling is not None:`) or 0.6.3 (line 1741)",
    summary="a Gemma 3 config's max_position_embeddings is vLLM's limit as it stands: its rope_scaling factor "
            "is not applied again")
VLLM_YARN_POSITIONS_PRESCALED = Behaviour(
    name="vllm_yarn_positions_prescaled", package="vllm", since="0.30.0",
    code_path="vllm/config/model.py _get_and_verify_max_len: 0.30.0 (line 2471) and 0.32 leave the factor out for "
              "yarn, deepseek_yarn and deepseek_llama_scaling ('YaRN variants leave max_position_embeddings already "
              "scaled'); up to 0.29.0 (line 2457) `if rope_type == \"yarn\": derived_max_model_len = "
              "rp[\"original_max_position_embeddings\"]`, then times the factor (0.6.3 line 1766 on)",
    summary="a YaRN config's max_position_embeddings is vLLM's limit as it stands, not original x factor")
SGLANG_FRACTION_OF_FREE = Behaviour(
    name="sglang_fraction_of_free", package="sglang", since="0.5.10",
    code_path="sglang/srt/model_executor/model_runner_kv_cache_mixin.py: 0.5.10 on, rest = post_model_load - "
              "pre_model_load x (1 - mem_fraction_static); up to 0.5.9 (model_runner.py profile_max_num_token, "
              "read at 0.4.4.post3, 0.4.6.post5, 0.5.2, 0.5.8, 0.5.9), rest = available - total x (1 - "
              "mem_fraction_static)",
    summary="SGLang's mem_fraction_static is a fraction of the memory free before the model loads, not of the GPU")
# verl builds FSDP2 with the same fsdp_kwargs for every layer and the root (verl/utils/fsdp_utils.py apply_fsdp2:
# `fully_shard(model, **fsdp_kwargs)  # fsdp2 will not reshard_after_forward for root module`), the kwargs holding
# an explicit fsdp_config.reshard_after_forward (True by default). torch up to 2.7 cleared every root's post-forward
# resharding in FSDPState._lazy_init, so the comment held; from 2.8.0 (pytorch PRs #154704 and #155319, 2025-06)
# only reshard_after_forward=None ("auto") keeps the root gathered, and an explicit True reshards it after the
# forward too (torch/distributed/fsdp/_fully_shard/_fsdp_state.py: `if self._auto_reshard_after_forward`; read in
# the 2.7.1 and 2.8.0 wheels). The stack names no torch: the rollout engine pins it in the trainer's environment,
# so the range is the engine's first release on torch 2.8 (vllm setup requirements: 0.10.1.1 pins torch==2.7.1,
# 0.10.2 and 0.11.0 torch==2.8.0; sglang[srt]: 0.4.6.post5 torch==2.6.0, 0.4.10.post2 2.7.1, 0.5.0rc2 on 2.8.0).
_ROOT_RESHARD_CODE_PATH = ("torch/distributed/fsdp/_fully_shard/_fsdp_state.py FSDPState._lazy_init (root's "
                           "post_forward_mesh_info cleared only for reshard_after_forward=None from torch 2.8.0), "
                           "reached by verl/utils/fsdp_utils.py apply_fsdp2's explicit reshard_after_forward")
_ROOT_RESHARD_SUMMARY = ("FSDP2 (torch >= 2.8, pinned by the engine) reshards the root group (lm_head, final norm, a tied "
                         "embedding) after the forward: a head run on the logits outside the forward holds no gathered "
                         "lm_head; the root's pre-backward gathers it again for the lm_head's backward")
ROOT_RESHARDS_AFTER_FORWARD = Behaviour(name="root_reshards_after_forward", package="vllm", since="0.10.2",
                                        code_path=_ROOT_RESHARD_CODE_PATH + " (vllm 0.10.2 pins torch 2.8.0)",
                                        summary=_ROOT_RESHARD_SUMMARY)
ROOT_RESHARDS_AFTER_FORWARD_SGLANG = Behaviour(name="root_reshards_after_forward_sglang", package="sglang",
                                               since="0.5.0",
                                               code_path=_ROOT_RESHARD_CODE_PATH + " (sglang 0.5.0 pins torch 2.8.0)",
                                               summary=_ROOT_RESHARD_SUMMARY)

# The weight sync's bucket and the learning-rate warm-up: defaults a plan for an older release takes from it.
WEIGHT_SYNC_BUCKET_512 = Behaviour(
    name="weight_sync_bucket_512", package="verl", before="0.7.1",
    code_path="verl/trainer/config/rollout/rollout.yaml rollout.update_weights_bucket_megabytes: 512 (v0.5.0 to "
              "v0.7.0; verl/workers/config/rollout.py RolloutConfig's default 512 in v0.6.1, v0.7.0), read only by "
              "the SGLang sync (verl/workers/sharding_manager/fsdp_sglang.py get_named_tensor_buckets, "
              "v0.5.0-v0.6.1; sglang_rollout.py in v0.7.0), vLLM's load_weights taking a tensor at a time; "
              "rollout.checkpoint_engine.update_weights_bucket_megabytes: 2048 from the v0.7.1 wheel; no key "
              "before v0.5.0, where fsdp_sglang.py update_weights serializes a tensor at a time (v0.4.1)",
    summary="the weight sync pushes buckets of at most 512 MB (none larger before v0.5.0)",
    default=("rollout.update_weights_bucket_megabytes", 512))
WARMUP_ZERO_READS_RATIO = Behaviour(
    name="warmup_zero_reads_ratio", package="verl", since="0.8.0",
    opt_out=LEGACY_WORKER_SWITCH,
    opt_in=("trainer.use_legacy_worker_impl", "disable", "0.7.0", "0.8.0"),
    code_path="verl/workers/fsdp_workers.py _build_model_optimizer (the legacy worker, the default up to v0.7.x): "
              "int(optim.get('lr_warmup_steps', -1)), and only `if num_warmup_steps < 0` "
              "int(lr_warmup_steps_ratio * total_steps) (v0.3.0.post1-v0.7.1); "
              "verl/workers/engine/fsdp/transformer_impl.py (the engine worker, default from v0.8.0): "
              "`if num_warmup_steps <= 0` (v0.6.0 to the v0.9.1 wheel; v0.5.0's engine_impl.py `< 0`); "
              "verl/utils/megatron/optimizer.py: the ratio where lr_warmup_steps is None or <= 0 (v0.4.1-v0.9.1); "
              "optim.lr_warmup_steps defaults to -1 (None in ppo_megatron_trainer.yaml v0.4.1-v0.5.0), "
              "lr_warmup_steps_ratio to 0.0, in every release",
    summary="an FSDP actor's optim.lr_warmup_steps=0 hands the warm-up to lr_warmup_steps_ratio, as -1 does "
            "(the legacy worker reads 0 as no warm-up whatever the ratio)")
# verl's optim.lr_warmup_steps default: "take lr_warmup_steps_ratio of the run's steps" on every worker of every
# release (WARMUP_ZERO_READS_RATIO's code paths); the plan's 0 (no warm-up steps of its own) is rendered as this,
# so a script's lr_warmup_steps_ratio works as under verl's own default.
VERL_WARMUP_STEPS_DEFAULT = -1

# Where verl flushes torch's caching allocator around the weight sync and the rollout, and whether its trainer
# phases run on expandable segments (memory.allocator_trace replays a step with them).
# Before the weight sync, per backend (allocator_trace._weight_sync picks the one of the plan's actor.strategy).
EMPTIES_CACHE_BEFORE_SYNC = Behaviour(
    name="empties_cache_before_sync", package="verl", since="0.8.0", before="0.9.0", outside=True,
    opt_out=("trainer.use_legacy_worker_impl", ("disable",), "0.7.1", "0.8.0"),
    opt_in=("trainer.use_legacy_worker_impl", "auto", "0.8.0", "0.8.1"),
    code_path="FSDP: the legacy worker flushes first: verl/workers/sharding_manager/fsdp_vllm.py __enter__ (v0.3-v0.5: "
              "empty_cache before state_dict), fsdp_workers.py rollout_mode (v0.6, v0.7, main 0.8.0.dev line 679: "
              "aggressive_empty_cache first); the engine worker (engine_workers.py) flushes first in v0.7.0's wake_up "
              "(line 552), not in update_weights from the v0.7.1 wheel (line 618) or v0.8.0 (line 667: only after the "
              "sync), and again from v0.9.0 (line 761: aggressive_empty_cache after set_expandable_segments(False); "
              "v0.9.1 line 769: empty_cache); FSDPEngine.get_per_tensor_param's load_fsdp_model_to_gpu does not flush. "
              "So it holds outside 0.8.x, except the engine worker of 0.7.1+ (use_legacy_worker_impl=disable), and "
              "on 0.8.0.dev trees that keep the legacy worker (use_legacy_worker_impl=auto; =enable not priced)",
    summary="an FSDP trainer's cache is flushed before the weight sync")
MEGATRON_EMPTIES_CACHE_BEFORE_SYNC = Behaviour(
    name="megatron_empties_cache_before_sync", package="verl", since="0.4.0",
    code_path="Megatron: verl/workers/sharding_manager/megatron_vllm.py __enter__ (v0.4.1, v0.5.0: empty_cache "
              "first; v0.3.0.post1 none; 0.4.0 not read, taken with 0.4.1), megatron_workers.py rollout_mode (v0.6.1 "
              "line 570, v0.7.0, main 0.8.0.dev line 678: aggressive_empty_cache first); on the engine worker "
              "MegatronEngine.get_per_tensor_param calls verl/utils/megatron_utils.py load_megatron_model_to_gpu, "
              "loaded or not, which ends with gc.collect() and empty_cache() before the weights are exported (v0.7.0 "
              "lines 441-468, v0.7.1 461-509, v0.8.0 549-597, v0.9.1 802-849), besides update_weights' own flush "
              "from v0.9.0",
    summary="a Megatron trainer's cache is flushed before the weight sync on every worker (after its parameters "
            "are back on the GPU on the engine worker; priced at the sync's start)")
EMPTIES_CACHE_AFTER_SYNC = Behaviour(
    name="empties_cache_after_sync", package="verl", since="0.4.0",
    code_path="verl/workers/sharding_manager/fsdp_vllm.py __enter__ (v0.4.0: empty_cache after update_params, "
              "before wake_up(kv_cache)); fsdp_workers.py rollout_mode (v0.6, v0.7); engine_workers.py "
              "update_weights (v0.8+: aggressive_empty_cache before resume kv_cache); Megatron's alike: megatron_vllm.py "
              "__enter__ after the load (v0.4.1, v0.5.0), megatron_workers.py rollout_mode (v0.6.1-main)",
    summary="the weight sync's gathered tensors are flushed from the cache before the KV cache wakes")
EMPTIES_CACHE_AFTER_ROLLOUT = Behaviour(
    name="empties_cache_after_rollout", package="verl", before="0.8.0",
    code_path="verl/workers/sharding_manager/fsdp_vllm.py __exit__ (v0.3-v0.5: empty_cache after sleep; v0.4+ "
              "also generate_sequences' end); fsdp_workers.py trainer_mode (v0.6, v0.7: aggressive_empty_cache); "
              "Megatron's alike: megatron_vllm.py __exit__ (v0.4.1, v0.5.0), megatron_workers.py trainer_mode",
    summary="the trainer's cache is flushed when the engine goes to sleep")
ENGINE_IN_TRAINER_PROCESS = Behaviour(
    name="engine_in_trainer_process", package="verl", before="0.7.1",
    code_path="verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py (sync mode: vLLM's LLM with the "
              "external_launcher executor in the worker, v0.3-v0.5); the async server's "
              "ExternalZeroMQDistributedExecutor sends init_worker / init_device / load_model to the trainer's "
              "workers, whose vLLMAsyncRollout holds vLLM's WorkerWrapperBase (v0.6.1 vllm_async_server.py line 61; "
              "v0.7.0 vllm_async_server.py lines 80-108, vllm_rollout.py line 205, rollout/base.py line 82 "
              "('vllm', 'async') -> vLLMAsyncRollout); from the v0.7.1 wheel vLLMHttpServer starts vLLM with "
              "distributed_executor_backend 'mp' (vllm_async_server.py line 306; v0.8.0 line 257, v0.9.1 line 329, "
              "main 0.8.0.dev line 268) and the trainer holds a ServerAdapter (rollout/base.py line 84)",
    summary="vLLM runs in the trainer's process: its forward passes use the trainer's caching allocator, and its "
            "start-up snapshot sees the trainer's context only")
# Where vLLM runs in processes of its own, its start-up snapshot (VLLM_REFUSES_SHORT_FREE_MEMORY) also sees what the
# trainer's caching allocator still holds; from v0.7.1 every trainer worker flushes it as init_model ends, before
# ray_trainer.py init_workers builds the AgentLoopManager that launches the servers.
TRAINER_FLUSHED_AT_ENGINE_START = Behaviour(
    name="trainer_flushed_at_engine_start", package="verl", since="0.7.1",
    code_path="init_model's last statement aggressive_empty_cache(force_sync=True) 'so colocated vLLM processes can "
              "see it via cudaMemGetInfo': verl/workers/fsdp_workers.py line 995, megatron_workers.py line 677, "
              "engine_workers.py line 583 (v0.7.1 wheel); engine_workers.py line 632 (v0.8.0), line 691 (v0.9.1); "
              "ray_trainer.py init_workers calls actor_rollout_wg.init_model() last, then AgentLoopManager.create "
              "(v0.7.1 lines 802, 838); not in v0.7.0 (fsdp_workers.py init_model ends without it; vLLM's own "
              "init_device empties the process's cache there, the engine being in it). verl's main at 0.8.0.dev "
              "(January 2026) lacked it in engine_workers.py / fsdp_workers.py (megatron_workers.py line 673: "
              "empty_cache): a tree between releases, priced as the 0.8.0 release",
    summary="the trainer's cached but free blocks are returned to the device before the vLLM servers start")
TRAINER_EXPANDABLE_SEGMENTS = Behaviour(
    name="trainer_expandable_segments", package="verl", since="0.6.0",
    code_path="verl/workers/fsdp_workers.py trainer_mode set_expandable_segments(True), rollout_mode False "
              "(v0.6.0, v0.7.0); megatron_workers.py alike (v0.6.1, v0.7.0; main: True after update_weights; "
              "MEGATRON_CI_DISABLE_EXPANDABLE_SEGMENTS=1 keeps it off, not priced); engine_workers.py "
              "update_weights False for the sync, True after (v0.8+); "
              "verl/utils/device.py torch.cuda.memory._set_allocator_settings",
    summary="the trainer phases allocate from expandable segments whatever PYTORCH_CUDA_ALLOC_CONF says; "
            "the weight sync does not")

BEHAVIOURS: tuple[Behaviour, ...] = (
    ENTROPY_COEFF_DEFAULT_0001, REFERENCE_ALWAYS_RUNS, ENTROPY_IN_EVERY_PASS, REWARD_TIMED_IN_ADV,
    EAGER_ROLLOUT_DEFAULT, UNSTAGED_WAKE_UP, ASYNC_RECIPES_IN_PACKAGE, SPIN_SPPO_RECIPES, MODEL_MTP, REF_LOADS_BF16, VALIDATES_BEFORE_TRAIN,
    ENGINE_WORKER, ENGINE_MICRO_SPLIT_ASSERT, MICRO_OUTPUTS_HELD_TO_MINI_END, SOFT_TOKEN_BUDGET, AGENT_LOOP, ASYNC_ROLLOUT_DEFAULT,
    PROMPTS_DISPATCHED_BEFORE_REPEAT, MEGATRON_MICRO_SPLIT_ASSERT, REAL_BATCH_CHECKED_UNDER_DYNAMIC_BSZ,
    MEGATRON_GRAD_OFFLOAD_ABSENT, MEGATRON_PP_STAGES_LOADED_FOR_ROLLOUT, WORKER_HOLDS_BATCH_ON_GPU,
    FSDP_ACTOR_UPDATE_BATCH_ON_HOST, MEGATRON_CRITIC_HOLDS_BATCH_ON_GPU, LEN_FROM_SEQUENCES, LEN_FROM_MODEL_ALWAYS, ROPE_SCALED_SKIPS_LEN_ASSERT,
    ROPE_SCALED_LEN_ASSERT, ROLLOUT_HF_MODEL_CONFIG, OVERRIDE_CONFIG_RECURSES, CHUNKED_PREFILL_NEEDS_MODEL_LEN,
    BATCHED_TOKENS_RAISED, VLLM_V1_FORCES_CHUNKED_PREFILL, LORA_RANK_UNROUNDED, VLLM_V0_ENGINE, VLLM_V1_WHOLE_GPU_PROFILE, VLLM_V0_WHOLE_GPU_PROFILE,
    VLLM_REFUSES_SHORT_FREE_MEMORY, VLLM_GEMMA3_POSITIONS_PRESCALED, VLLM_YARN_POSITIONS_PRESCALED,
    SGLANG_FRACTION_OF_FREE, ROOT_RESHARDS_AFTER_FORWARD, ROOT_RESHARDS_AFTER_FORWARD_SGLANG,
    EMPTIES_CACHE_BEFORE_SYNC, MEGATRON_EMPTIES_CACHE_BEFORE_SYNC, EMPTIES_CACHE_AFTER_SYNC, EMPTIES_CACHE_AFTER_ROLLOUT, ENGINE_IN_TRAINER_PROCESS,
    TRAINER_FLUSHED_AT_ENGINE_START,
    TRAINER_EXPANDABLE_SEGMENTS, WEIGHT_SYNC_BUCKET_512, WARMUP_ZERO_READS_RATIO, SLEEP_LEVEL_TWO, VLLM_SLEEP_LEVEL_TWO)


# The ranks vLLM's LoRAConfig takes as max_lora_rank (vllm/config.py LoRAConfig.__post_init__ possible_max_ranks;
# vllm/config/lora.py from 0.11): read at 0.7.3 (up to 256) and 0.8.5 and 0.11.0 (320 and 512 too).
VLLM_LORA_RANKS_BY_VERSION: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("0.0.0", (8, 16, 32, 64, 128, 256)),
    ("0.8.5", (8, 16, 32, 64, 128, 256, 320, 512)),
)


def switch_decides(release: str, passthrough: Mapping[str, str], key: str, value: str) -> bool:
    """Whether `key=value` added to `passthrough` turns some verl behaviour on or off at `release` (a release
    whose default it is changes nothing): what a source tree's switch default must do to be kept."""
    stack = StackSection(verl=release)
    trial = {**passthrough, key: value}
    return any(holds(b, stack, passthrough=trial) != holds(b, stack, passthrough=passthrough) for b in BEHAVIOURS)


def source_tree_switches() -> tuple[str, ...]:
    """The keys whose value turns a verl behaviour on or off (`Behaviour.opt_in` / `opt_out`): the import reads
    their defaults from a verl source tree between releases, whose config may still carry them."""
    keys = {b.opt_in[0] for b in BEHAVIOURS if b.opt_in} | {b.opt_out[0] for b in BEHAVIOURS if b.opt_out}
    return tuple(sorted(keys))


def vllm_lora_ranks(stack: StackSection) -> tuple[int, ...]:
    """The max_lora_rank values the stack's vLLM accepts."""
    release = parse_version(stack.version_of("vllm"))
    return [ranks for since, ranks in VLLM_LORA_RANKS_BY_VERSION if release >= parse_version(since)][-1]


def vllm_engine_of(stack: StackSection) -> VllmEngine:
    """The vLLM engine the stack runs: the one the script chose, else its vLLM's default (V0 before 0.8.0)."""
    if stack.vllm_engine is not None:
        return stack.vllm_engine
    return "v0" if holds(VLLM_V0_ENGINE, stack) else "v1"


def kv_pool_charges_the_whole_gpu(stack: StackSection, engine: str) -> bool:
    """Whether the engine's KV pool is what util x GPU leaves after everything on the device (the trainer's
    resident state included), not after what the engine itself adds: vLLM V1 before 0.9.1, V0 0.6.4.x, and
    SGLang before 0.5.10 (whose fraction is of the whole GPU; from 0.5.10 it is of the memory free before the
    load, `SGLANG_FRACTION_OF_FREE`)."""
    if engine == "sglang":
        return not holds(SGLANG_FRACTION_OF_FREE, stack, engine)
    mode = vllm_engine_of(stack)
    return holds(VLLM_V1_WHOLE_GPU_PROFILE if mode == "v1" else VLLM_V0_WHOLE_GPU_PROFILE, stack, engine)


def engine_refuses_short_free_memory(stack: StackSection, engine: str) -> bool:
    """Whether the rollout engine refuses to start when the GPU's free memory is below its utilization x GPU:
    vLLM's V1 engine from 0.9.1 (`VLLM_REFUSES_SHORT_FREE_MEMORY`). Not V0, not SGLang (its start-up tests are
    the TP ranks' balance and a KV pool above zero: sglang/srt/model_executor/model_runner.py, 0.4.6.post5,
    0.5.2, 0.5.10), not TensorRT-LLM (a fraction of the free memory)."""
    return (engine == "vllm" and vllm_engine_of(stack) == "v1"
            and holds(VLLM_REFUSES_SHORT_FREE_MEMORY, stack, engine))


def unnamed_engine_range(stack: StackSection, behaviour: Behaviour) -> tuple[str, str] | None:
    """Where the stack names no version of `behaviour`'s engine and the range its verl release installs holds
    releases on both sides of it (an engine behaviour): that range, (lowest, highest), the text "any" for an open
    end; None where the version is named or the behaviour holds alike over the range."""
    engine = behaviour.package
    if engine == "verl" or getattr(stack, engine) is not None:
        return None
    lowest, highest = engine_pins(stack.verl, engine)
    chosen = stack.version_of(engine)
    ends = [version for version in (lowest, highest) if version is not None]
    if lowest is None and behaviour.since is not None:
        ends.append("0.0.0")  # open below: every older release is allowed
    if all(behaviour.holds_for(end) == behaviour.holds_for(chosen) for end in ends):
        return None
    return lowest or "any", highest or "any"


def root_reshards_after_forward(stack: StackSection, engine: str) -> bool:
    """Whether the trainer's torch (the one `engine` pins on `stack`) reshards verl's root FSDP2 group after the
    forward (ROOT_RESHARDS_AFTER_FORWARD, for vLLM and SGLang)."""
    return any(holds(behaviour, stack, engine)
               for behaviour in (ROOT_RESHARDS_AFTER_FORWARD, ROOT_RESHARDS_AFTER_FORWARD_SGLANG))


def stack_defaults(stack: StackSection, engine: str = "vllm") -> dict[str, Any]:
    """The plan keys whose defaults differ on `stack` from rlplan's (verl 0.9's), as `apply_knobs` takes them."""
    return dict(b.default for b in BEHAVIOURS if b.default is not None and holds(b, stack, engine))


def stack_from_flags(base: StackSection, verl: str | None, vllm: str | None, sglang: str | None) -> StackSection:
    """`base` with the versions given by `--verl-version` / `--vllm-version` / `--sglang-version`."""
    given = {name: value for name, value in (("verl", verl), ("vllm", vllm), ("sglang", sglang)) if value is not None}
    for name, value in given.items():
        parse_version(value, f"--{name}-version")
    if not given:
        return base
    changes: dict[str, Any] = dict(given)
    if verl is not None:  # the release is named: no inferred range is left
        changes["verl_oldest"] = None
    if vllm is not None and parse_version(vllm) >= parse_version(VLLM_V0_REMOVED):
        changes["vllm_engine"] = None  # a vLLM without V0 runs V1 whatever the script exported
    return attrs.evolve(base, **changes)


def stack_pins(stack: StackSection) -> dict[str, Any]:
    """The stack as dotted pins (`stack.verl`), for building a plan through `apply_knobs` or the solver. An import's
    inferred range (`verl_oldest`) is evidence about a script, not a target: a plan solved from it is for `verl`."""
    return {f"stack.{name}": value for name, value in attrs.asdict(stack).items()
            if value is not None and name != "verl_oldest"}


def solve_pins(base: StackSection, verl: str | None, vllm: str | None, sglang: str | None) -> dict[str, Any]:
    """What `solve` pins for its target stack (the --from plan's, with the version flags): the stack itself and the
    defaults of that verl (a version without a knob cannot have it switched on). Nothing on the default stack."""
    stack = stack_from_flags(base, verl, vllm, sglang)
    return {} if stack == DEFAULT_STACK else {**stack_defaults(stack), **stack_pins(stack)}


# --- what a launch script shows of its stack (`rlplan import verl`) -------------------------------------------

# verl's releases, oldest first (tags of volcengine/verl read for docs/verl-versions.md): an inferred verl is one.
VERL_RELEASES = ("0.3.0.post1", "0.4.0", "0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
                 "0.9.1")


@frozen(kw_only=True)
class KeyEra:
    """A verl key rlplan does not model (kept as passthrough) that only some verl versions accept."""

    key: str
    value: str | None  # the value that shows the era (None: any)
    since: str | None = None
    before: str | None = None
    why: str = ""


REMOVED_KEYS = (
    KeyEra(key="actor_rollout_ref.rollout.mode", value="sync", before="0.7.0",
           why="verl/workers/config/rollout.py RolloutConfig.__post_init__ refuses mode=sync from v0.7.0"),
    KeyEra(key="actor_rollout_ref.rollout.use_fire_sampling", value=None, before="0.5.0",
           why="ppo_trainer.yaml has rollout.use_fire_sampling up to v0.4.1"),
)
