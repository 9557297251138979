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
from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.errors import PlanError

Package = Literal["verl", "vllm", "sglang"]
Version = tuple[int, int, int]

# verl: the version nox's verl_compat session installs and checks the rules against (noxfile.VERL).
DEFAULT_VERL = "0.9.1"
# The engine versions rlplan's rollout terms were read at: vLLM's V1 engine at 0.11 (llm-d, memory-model.md G6-G8;
# the KV capacity is checked against vLLM 0.32's own engine on CPU by tests/runtime/test_kv_capacity.py), SGLang at
# verl 0.4's pin (G11, G13, 2025-06). A plan's engine version left out is one of these only where its verl release
# allows it (`default_engine_version`).
FITTED_VLLM = "0.11.0"
FITTED_SGLANG = "0.4.6.post5"
FITTED_ENGINE_VERSIONS: dict[str, str] = {"vllm": FITTED_VLLM, "sglang": FITTED_SGLANG}

# What each verl release's `vllm` and `sglang` extras allow (its wheel's Requires-Dist, read 2026-11-25 from PyPI):
# (lowest, highest), both inclusive, None where open. A release between two of these has the older one's pins.
VERL_ENGINE_PINS: dict[str, dict[str, tuple[str | None, str | None]]] = {
    "0.3.0.post1": {"vllm": (None, "0.8.2"), "sglang": ("0.4.4.post3", "0.4.4.post3")},
    "0.4.0": {"vllm": (None, "0.8.5"), "sglang": ("0.4.6.post5", "0.4.6.post5")},
    "0.5.0": {"vllm": ("0.7.3", "0.8.5"), "sglang": ("0.4.6.post5", "0.4.6.post5")},
    "0.6.0": {"vllm": ("0.7.3", "0.9.1"), "sglang": ("0.5.2", "0.5.2")},
    "0.6.1": {"vllm": ("0.8.5", "0.11.0"), "sglang": ("0.5.5", "0.5.5")},
    "0.7.0": {"vllm": ("0.8.5", "0.12.0"), "sglang": ("0.5.6", "0.5.6")},
    "0.8.0": {"vllm": ("0.8.5", "0.12.0"), "sglang": ("0.5.8", "0.5.8")},
    "0.9.0": {"vllm": ("0.18.0", None), "sglang": ("0.5.8", "0.5.8")},
    "0.9.1": {"vllm": ("0.24.0", "0.24.0"), "sglang": ("0.5.12", "0.5.12")},
}


# 0.4.1, v0.3.0.post1, 0.8.0.dev, 0.5.0rc1, 0.11.1+cu128: the release numbers, then any pre/post/dev/local tail.
_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[.\-+]?(?:post|dev|rc|a|b|\+)[\w.+-]*)?")


@functools.lru_cache(maxsize=256)  # the solver's inner loop asks about the same few versions thousands of times
def parse_version(text: str, where: str = "stack.verl") -> Version:
    """`0.4.1` -> (0, 4, 1); a suffix (post1, dev, rc1, +cu128) counts as its release. A PlanError naming
    `where` for anything else."""
    match = _VERSION.fullmatch(str(text).strip())
    if match is None:
        raise PlanError(field=where, message=f"{text!r} is not a version.",
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
        return ", ".join(f"{name} {version}" for name, version in self.resolved(engine).items())


DEFAULT_STACK = StackSection()


def engine_pins(verl: str, engine: str) -> tuple[str | None, str | None]:
    """The (lowest, highest) `engine` version verl release `verl` installs with (VERL_ENGINE_PINS: the newest
    listed release not after it; one older than all: the oldest's)."""
    release = parse_version(verl)
    listed = sorted(VERL_ENGINE_PINS, key=parse_version)
    known = [name for name in listed if parse_version(name) <= release] or listed[:1]
    return VERL_ENGINE_PINS[known[-1]][engine]


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
    other = "sglang" if engine == "vllm" else "vllm"
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

    def holds_for(self, version: str) -> bool:
        return in_range(version, self.since, self.before)

    @property
    def versions(self) -> str:
        if self.since and self.before:
            return f"{self.package} {self.since} to before {self.before}"
        return f"{self.package} >= {self.since}" if self.since else f"{self.package} < {self.before}"


def holds(behaviour: Behaviour, stack: StackSection, engine: str = "vllm") -> bool:
    """Whether `behaviour` holds on `stack` (an engine's behaviour holds only for a plan rolling out with it)."""
    if behaviour.package == "verl":
        return behaviour.holds_for(stack.verl)
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
ENGINE_WORKER = Behaviour(
    name="engine_worker", package="verl", since="0.8.0",
    code_path="verl/trainer/main_ppo.py: the engine worker (verl/workers/engine_workers.py) is the default from "
              "v0.8.0; in v0.7.x only with trainer.use_legacy_worker_impl=disable",
    summary="the engine worker runs the actor, and asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz")
MICRO_OUTPUTS_HELD_TO_MINI_END = Behaviour(
    name="micro_outputs_held_to_mini_end", package="verl", since="0.8.0", before="0.9.0",
    code_path="verl/workers/engine/fsdp/transformer_impl.py FSDPEngine.forward_backward_batch: output_lst keeps "
              "each micro batch's model_output (log_probs, entropy) until the mini batch ends (PR #6984, v0.9.0)",
    summary="the update holds every earlier micro batch's grad-connected log-probs and entropy until the mini "
            "batch ends: update memory grows with the mini batch's tokens")
SOFT_TOKEN_BUDGET = Behaviour(
    name="soft_token_budget", package="verl", before="0.9.1",
    code_path="verl/utils/seqlen_balancing.py rearrange_micro_batches: ceil(tokens / max_token_len) micro batches "
              "balanced by Karmarkar-Karp (PR #7553, 2026-08-25, after v0.9.0's 2026-08-14 branch)",
    summary="max_token_len is not a hard cap: one micro batch may hold more tokens than the budget")
VLLM_V0_ENGINE = Behaviour(
    name="vllm_v0_engine", package="vllm", before="0.9.0",
    code_path="vllm/worker/worker.py Worker.determine_num_available_blocks (V0; VLLM_USE_V1 or an attention "
              "backend V1 lacks, such as XFORMERS, selects it up to 0.8.x)",
    summary="vLLM's V0 engine: a smaller profile-run sampler than V1's")
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

# Where verl flushes torch's caching allocator around the weight sync and the rollout, and whether its trainer
# phases run on expandable segments (memory.allocator_trace replays a step with them).
EMPTIES_CACHE_BEFORE_SYNC = Behaviour(
    name="empties_cache_before_sync", package="verl", before="0.8.0",
    code_path="verl/workers/sharding_manager/fsdp_vllm.py __enter__ (v0.3-v0.5: empty_cache before state_dict); "
              "fsdp_workers.py rollout_mode (v0.6, v0.7: aggressive_empty_cache first); the v0.8 engine workers' "
              "update_weights flushes only after the sync (engine_workers.py, read at HEAD 2026-01-29)",
    summary="the trainer's cache is flushed before the weight sync")
EMPTIES_CACHE_AFTER_SYNC = Behaviour(
    name="empties_cache_after_sync", package="verl", since="0.4.0",
    code_path="verl/workers/sharding_manager/fsdp_vllm.py __enter__ (v0.4.0: empty_cache after update_params, "
              "before wake_up(kv_cache)); fsdp_workers.py rollout_mode (v0.6, v0.7); engine_workers.py "
              "update_weights (v0.8+: aggressive_empty_cache before resume kv_cache)",
    summary="the weight sync's gathered tensors are flushed from the cache before the KV cache wakes")
EMPTIES_CACHE_AFTER_ROLLOUT = Behaviour(
    name="empties_cache_after_rollout", package="verl", before="0.8.0",
    code_path="verl/workers/sharding_manager/fsdp_vllm.py __exit__ (v0.3-v0.5: empty_cache after sleep; v0.4+ "
              "also generate_sequences' end); fsdp_workers.py trainer_mode (v0.6, v0.7: aggressive_empty_cache)",
    summary="the trainer's cache is flushed when the engine goes to sleep")
ENGINE_IN_TRAINER_PROCESS = Behaviour(
    name="engine_in_trainer_process", package="verl", before="0.7.0",
    code_path="verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py (sync mode: vLLM's LLM with the "
              "external_launcher executor in the worker, v0.3-v0.5) and v0.6's in-process "
              "ExternalZeroMQDistributedExecutor; v0.7's vLLMHttpServer runs vLLM in its own processes "
              "(shared/reference/verl-metrics.md)",
    summary="vLLM runs in the trainer's process: its forward passes use the trainer's caching allocator")
TRAINER_EXPANDABLE_SEGMENTS = Behaviour(
    name="trainer_expandable_segments", package="verl", since="0.6.0",
    code_path="verl/workers/fsdp_workers.py trainer_mode set_expandable_segments(True), rollout_mode False "
              "(v0.6.0, v0.7.0); engine_workers.py update_weights False for the sync, True after (v0.8+); "
              "verl/utils/device.py torch.cuda.memory._set_allocator_settings",
    summary="the trainer phases allocate from expandable segments whatever PYTORCH_CUDA_ALLOC_CONF says; "
            "the weight sync does not")

BEHAVIOURS: tuple[Behaviour, ...] = (ENTROPY_COEFF_DEFAULT_0001, REFERENCE_ALWAYS_RUNS, ENTROPY_IN_EVERY_PASS,
                                     REWARD_TIMED_IN_ADV, EAGER_ROLLOUT_DEFAULT, UNSTAGED_WAKE_UP,
                                     REF_LOADS_BF16, VALIDATES_BEFORE_TRAIN, ENGINE_WORKER, MICRO_OUTPUTS_HELD_TO_MINI_END, SOFT_TOKEN_BUDGET,
                                     VLLM_V0_ENGINE, ROOT_RESHARDS_AFTER_FORWARD, ROOT_RESHARDS_AFTER_FORWARD_SGLANG,
                                     EMPTIES_CACHE_BEFORE_SYNC, EMPTIES_CACHE_AFTER_SYNC, EMPTIES_CACHE_AFTER_ROLLOUT,
                                     ENGINE_IN_TRAINER_PROCESS, TRAINER_EXPANDABLE_SEGMENTS)


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
    return attrs.evolve(base, **given) if given else base


def stack_pins(stack: StackSection) -> dict[str, Any]:
    """The stack as dotted pins (`stack.verl`), for building a plan through `apply_knobs` or the solver."""
    return {f"stack.{name}": value for name, value in attrs.asdict(stack).items() if value is not None}


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

# vLLM's V0 engine: V1 does not support xformers attention, so vLLM 0.8.x falls back to V0 (and VLLM_USE_V1=0
# asks for it); V0 is gone from vLLM 0.11 on. The V0 era is taken as its last release, 0.8.5 (verl pinned
# vllm<=0.8.5 from v0.4.0 to v0.5.0).
_VLLM_V0 = re.compile(r"""\bVLLM_ATTENTION_BACKEND=["']?XFORMERS\b|\bVLLM_USE_V1=["']?0\b""")
VLLM_V0_ERA = "0.8.5"


@frozen(kw_only=True)
class InferredStack:
    stack: StackSection
    reasons: tuple[str, ...]


def _bounds_from_keys(given: dict[str, str], passthrough: dict[str, str],
                      key_ranges: dict[str, tuple[str | None, str | None]]) -> list[tuple[str | None, str | None, str]]:
    """(since, before, why) for every key the script sets that only some verl versions have."""
    found: list[tuple[str | None, str | None, str]] = []
    for key in given:
        since, before = key_ranges.get(key, (None, None))
        if since or before:
            found.append((since, before, f"{key} (verl {_range_text(since, before)})"))
    for era in REMOVED_KEYS:
        value = next((v for k, v in passthrough.items() if k.lstrip("+") == era.key), None)
        if value is not None and (era.value is None or value.strip("'\"") == era.value):
            found.append((era.since, era.before, f"{era.key}={value} (verl {_range_text(era.since, era.before)}: "
                                                 f"{era.why})"))
    return found


def _range_text(since: str | None, before: str | None) -> str:
    return " ".join(part for part in (f">= {since}" if since else "", f"< {before}" if before else "") if part)


def infer_stack(given: dict[str, str], passthrough: dict[str, str], script: str,
                key_ranges: dict[str, tuple[str | None, str | None]], engine: str) -> InferredStack | None:
    """The stack a script shows, with why; None when it shows nothing or its keys contradict each other.

    verl: the newest release every version-bound key admits (a script naming only keys every version has shows
    nothing). vLLM: the V0 era where the script selects V0's attention backend.
    """
    bounds = _bounds_from_keys(given, passthrough, key_ranges)
    reasons: list[str] = []
    changes: dict[str, str] = {}
    if not all(in_range(DEFAULT_VERL, since, before) for since, before, _ in bounds):
        fitting = [release for release in VERL_RELEASES
                   if all(in_range(release, since, before) for since, before, _ in bounds)]
        if fitting:
            changes["verl"] = fitting[-1]
            reasons.append(f"verl {fitting[-1]}, the newest release with " + "; ".join(why for *_, why in bounds))
        else:
            reasons.append("no verl release has all of " + "; ".join(why for *_, why in bounds)
                           + f"; verl stays {DEFAULT_VERL} (pass --verl-version)")
    if engine == "vllm" and _VLLM_V0.search(script):
        changes["vllm"] = VLLM_V0_ERA
        reasons.append(f"vLLM {VLLM_V0_ERA} (V0 engine era): the script selects V0 "
                       f"({_VLLM_V0.search(script).group(0)})")  # type: ignore[union-attr]
    if not reasons:
        return None
    return InferredStack(stack=StackSection(**changes), reasons=tuple(reasons))
