"""What each verl release runs on a composed config past hydra's compose, before a GPU is touched: its config
validation, the roles it starts, and its workers' batch normalisation and asserts, keyed by release range.

verl's own code runs wherever it runs on CPU (validate_config or RayPPOTrainer._validate_config, the config
dataclasses, DataProto.chunk / split, prepare_micro_batches on tiny tensors).  What lives in Ray-actor
constructors that need a GPU process group is restated line for line, each check citing the file, the function
and the releases it was read at (the wheels of every release; the volcengine/verl tags where the mirror has them).

Two worker eras (planner/stack.py ENGINE_WORKER):
- legacy  verl 0.3.0.post1 - 0.7.x: verl/workers/fsdp_workers.py ActorRolloutRefWorker / CriticWorker, whose
          __init__ normalises the global batch sizes to per-GPU ones, dp_actor.py / dp_critic.py's splits, and
          the trainer's dispatch (DataProto.chunk over the worker group, AgentLoopManager's chunk);
- engine  verl 0.8.0 on: verl/workers/engine_workers.py (no fsdp_workers.py in the 0.8.0 wheel).
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import importlib.metadata
import io
import types
from importlib import resources

from packaging.version import Version

# The verl release this environment installs: verl_compat installs one (noxfile.py), and plans are judged on it.
INSTALLED_VERL = importlib.metadata.version("verl")
RELEASE = Version(INSTALLED_VERL)


def since(release: str) -> bool:
    """Whether the installed verl is `release` or newer."""
    return RELEASE >= Version(release)


ENGINE_ERA = since("0.8.0")


def serve_removed_transformers_names() -> None:
    """verl 0.6.x-0.7.x's verl/utils/model.py imports AutoModelForVision2Seq at the top (for vision-language models
    the checks never load); transformers 5 (which verl_compat pins for every release) renamed it
    AutoModelForImageTextToText.  The old name is served as the new class so that verl's config modules import."""
    import transformers

    if not hasattr(transformers, "AutoModelForVision2Seq"):
        transformers.AutoModelForVision2Seq = transformers.AutoModelForImageTextToText


serve_removed_transformers_names()


class Rejected(Exception):
    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check


# --- roles and config validation -------------------------------------------------------------------------------

def roles(config) -> tuple[bool, bool]:
    """(use_reference_policy, use_critic) as the release's trainer decides them."""
    if since("0.6.0"):
        from verl.trainer.ppo.utils import need_critic, need_reference_policy

        return need_reference_policy(config), need_critic(config)
    # verl/trainer/ppo/ray_trainer.py RayPPOTrainer.__init__ (v0.3.0.post1-v0.5.0): use_critic only for GAE.
    use_critic = config.algorithm.adv_estimator == "gae"
    if not since("0.4.0"):
        # verl/trainer/main_ppo.py main_task (v0.3.0.post1): Role.RefPolicy is always in role_worker_mapping.
        return True, use_critic
    # verl/trainer/main_ppo.py (v0.4.0-v0.5.0): a RefPolicy role only with use_kl_in_reward or use_kl_loss.
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss), use_critic


def validate(config, use_ref: bool, use_critic: bool) -> None:
    """The release's own config validation, run as is: verl.utils.config.validate_config (v0.6.0 on, which also
    builds and validates the actor and critic dataclasses), else RayPPOTrainer._validate_config called on a
    stand-in trainer holding the attributes it reads (config, use_critic, use_reference_policy)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "All configuration checks passed" line
            if since("0.6.0"):
                from verl.utils.config import validate_config

                validate_config(config=config, use_reference_policy=use_ref, use_critic=use_critic)
            else:
                trainer = types.SimpleNamespace(config=config, use_critic=use_critic, use_reference_policy=use_ref)
                _trainer_validate_config()(trainer)
    except Exception as exc:  # any exception out of verl's checks is verl refusing the config
        raise Rejected("validate_config", str(exc)) from None


@functools.cache
def _trainer_validate_config():
    """RayPPOTrainer._validate_config (v0.3.0.post1-v0.5.0), compiled from verl's own ray_trainer.py with the
    AdvantageEstimator enum it reads (v0.4.x): the module itself imports torchdata and Ray's worker groups at the
    top, which this environment does not install.  Nothing of it is re-written here."""
    source = resources.files("verl.trainer.ppo").joinpath("ray_trainer.py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    body: list[ast.stmt] = [node for node in tree.body
                            if isinstance(node, ast.ClassDef) and node.name == "AdvantageEstimator"]
    trainer = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "RayPPOTrainer")
    body += [node for node in trainer.body if isinstance(node, ast.FunctionDef) and node.name == "_validate_config"]
    namespace: dict[str, object] = {"Enum": enum.Enum}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec"), namespace)
    return namespace["_validate_config"]


# --- the legacy FSDP worker (v0.3.0.post1 - v0.7.x) ---------------------------------------------------------

def _tiny(size: int):
    """A DataProto of `size` rows, as the trainer and the workers hold a batch."""
    import torch
    from verl.protocol import DataProto

    return DataProto.from_dict(tensors={"input_ids": torch.zeros(size, 1, dtype=torch.long)})


def _chunk(size: int, chunks: int, check: str, what: str) -> None:
    """verl/protocol.py DataProto.chunk, run: it asserts len % chunks == 0 (padding is on only for validation)."""
    try:
        _tiny(size).chunk(chunks)
    except Exception as exc:
        raise Rejected(check, f"{what}: {size} rows over {chunks} chunks: {exc}") from None


def _split(size: int, split_size: int, check: str, what: str) -> None:
    """The legacy actor's / critic's `data.split(n)` (dp_actor.py, dp_critic.py), run on DataProto (TensorDict's
    split at v0.3.0.post1, whose DataProto has none): a short last piece is taken; a size of 0 raises."""
    try:
        data = _tiny(size)
        data.split(split_size) if hasattr(data, "split") else data.batch.split(split_size)
    except Exception as exc:
        raise Rejected(check, f"{what}: {size} rows in pieces of {split_size}: {exc}") from None


def _normalise_role(role: str, mini: int, n: int, dp: int, micro_global: int | None, micro_per_gpu: int | None,
                    ) -> tuple[int, int | None]:
    """fsdp_workers.py ActorRolloutRefWorker.__init__ ("normalize config", v0.3.0.post1 lines 116-128, v0.4.0
    142-154, v0.6.0 233-254, v0.7.0 241-262) and CriticWorker.__init__ (v0.3.0.post1 646-657, v0.4.0 799-810,
    v0.6.0 1173-1192, v0.7.0 1235-1254): mini *= n (the critic's only from v0.4.0: `*= self.config.rollout_n`),
    mini //= dp; assert mini > 0 (the actor's; the critic's none); a global micro //= dp becomes the per-GPU one;
    then mini % micro == 0 and mini // micro > 0 are asserted (v0.3.0.post1: only where the global key was set)."""
    if role == "actor" or since("0.4.0"):
        mini *= n
    mini //= dp
    if role == "actor" and not mini > 0:
        raise Rejected("legacy_mini_positive", f"{role}: ppo_mini_batch_size normalises to {mini} per GPU")
    checked = since("0.4.0")
    if micro_global is not None:
        micro_per_gpu = micro_global // dp
        checked = True
    if micro_per_gpu is not None and checked:
        if micro_per_gpu == 0 or mini % micro_per_gpu or not mini // micro_per_gpu > 0:
            raise Rejected("legacy_micro_divides_mini",
                           f"{role}: normalised mini {mini} % micro per GPU {micro_per_gpu}")
    return mini, micro_per_gpu


def legacy_worker(config, use_ref: bool, use_critic: bool) -> None:
    """Raise Rejected where the legacy FSDP workers and the trainer's dispatch refuse the config."""
    arr = config.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    world = config.trainer.n_gpus_per_node * config.trainer.nnodes
    n = rollout.n
    # ActorRolloutRefWorker.__init__: the (dp, sp) Ulysses mesh, dp = world_size // sp (init_device_mesh needs
    # dp * sp == world).
    sp = actor.get("ulysses_sequence_parallel_size", 1)
    if world % sp:
        raise Rejected("legacy_ulysses_mesh", f"actor: world {world} % ulysses sp {sp}")
    dp = world // sp
    mini, micro = _normalise_role("actor", actor.ppo_mini_batch_size, n, dp, actor.ppo_micro_batch_size,
                                  actor.ppo_micro_batch_size_per_gpu)
    # _build_rollout: assert world_size % infer_tp == 0 (v0.3.0.post1-v0.5.0); from v0.6.0 infer_world_size =
    # tensor_model_parallel_size * data_parallel_size * pipeline_model_parallel_size.
    infer = rollout.tensor_model_parallel_size
    if since("0.6.0"):
        infer *= rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    if world % infer:
        raise Rejected("legacy_rollout_world", f"world {world} % rollout world {infer}")
    # "normalize rollout config" / "normalize ref config": a global log-prob micro batch //= dp, no assert; the
    # per-GPU size then splits each rank's batch in dp_actor.py compute_log_prob (`data.split(micro_batch_size)`).
    # Dispatch gives each rank train * n / world rows; FSDPUlyssesShardingManager.preprocess_data all-gathers them
    # within the sp group, so each dp rank holds train * n / dp.
    per_gpu = config.data.train_batch_size * n // dp
    passes = [("rollout", rollout)] + ([("ref", arr.ref)] if use_ref else [])
    for name, section in passes:
        if section.get("log_prob_use_dynamic_bsz", False):
            continue
        log_prob_micro = section.log_prob_micro_batch_size_per_gpu
        if section.log_prob_micro_batch_size is not None:
            log_prob_micro = section.log_prob_micro_batch_size // dp
        if per_gpu and log_prob_micro is not None:
            _split(per_gpu, log_prob_micro, "legacy_log_prob_split", f"{name} compute_log_prob")
    # dp_actor.py update_policy: data.split(ppo_mini_batch_size) always, then mini_batch.split(micro_per_gpu)
    # without dynamic batch size (rearrange_micro_batches with it).
    _split(per_gpu, mini, "legacy_update_split", "actor mini batches")
    if not actor.use_dynamic_bsz and micro is not None:
        _split(mini, micro, "legacy_update_split", "actor micro batches")
    if use_critic:
        critic = config.critic
        critic_sp = critic.get("ulysses_sequence_parallel_size", 1)
        if world % critic_sp:
            raise Rejected("legacy_ulysses_mesh", f"critic: world {world} % ulysses sp {critic_sp}")
        critic_dp = world // critic_sp
        critic_mini, critic_micro = _normalise_role(
            "critic", critic.ppo_mini_batch_size, n, critic_dp, critic.ppo_micro_batch_size,
            critic.ppo_micro_batch_size_per_gpu)
        # dp_critic.py update_critic: data.split(ppo_mini_batch_size) always, then mini_batch.split(micro_per_gpu)
        # without dynamic batch size; before v0.4.0 the critic's mini batch was never multiplied by n.
        _split(config.data.train_batch_size * n // critic_dp, critic_mini,
               "legacy_update_split" if since("0.4.0") else "legacy_critic_split_unscaled", "critic mini batches")
        if not critic.use_dynamic_bsz and critic_micro is not None:
            _split(critic_mini, critic_micro, "legacy_update_split", "critic micro batches")
    trainer_dispatch(config, world)


def _async_rollout(config) -> bool:
    """Whether the trainer generates through the agent loop: rollout.mode=async (v0.5.0-v0.6.1), always from
    v0.7.0 (rollout.yaml mode async; RolloutConfig.__post_init__ refuses sync)."""
    if since("0.7.0"):
        return True
    return since("0.5.0") and config.actor_rollout_ref.rollout.get("mode", "sync") == "async"


def agent_loop(config) -> None:
    """verl/experimental/agent_loop/agent_loop.py AgentLoopManager.generate_sequences (v0.5.0 line 497, v0.7.0 949,
    v0.8.0 1111, v0.9.1 1247): prompts.chunk(len(self.agent_loop_workers)) of the batch repeated n times, one worker
    per rollout.agent.num_workers (DataProto.chunk's equal-chunk assert, run)."""
    rollout = config.actor_rollout_ref.rollout
    _chunk(config.data.train_batch_size * rollout.n, rollout.agent.num_workers, "agent_loop_chunk",
           "AgentLoopManager.generate_sequences")


def trainer_dispatch(config, world: int) -> None:
    """verl/trainer/ppo/ray_trainer.py RayPPOTrainer.fit, legacy era: the workers' methods are registered
    Dispatch.DP_COMPUTE_PROTO (single_controller/base/decorator.py), which chunks the batch over the worker
    group's world size with DataProto.chunk (auto padding only where the trainer enabled it: validation)."""
    train, n = config.data.train_batch_size, config.actor_rollout_ref.rollout.n
    if _async_rollout(config):
        agent_loop(config)
    else:
        # fit (v0.3.0.post1 line 817, v0.4.0 line 1011): generate_sequences(gen_batch) of the train_batch_size
        # prompts, repeated n times only after (lines 838, 1035); from v0.5.0 gen_batch is repeated first
        # (v0.5.0 line 1163, v0.6.0 line 1040).
        if since("0.5.0"):
            _chunk(train * n, world, "dispatch_generate_chunk", "generate_sequences")
        else:
            _chunk(train, world, "dispatch_prompts_chunk", "generate_sequences of the prompts")
    # compute_log_prob, compute_ref_log_prob, compute_values, update_critic, update_actor: train * n rows.
    _chunk(train * n, world, "dispatch_chunk", "compute_log_prob / update_actor")


def legacy_dataclasses(config) -> None:
    """fsdp_workers.py ActorRolloutRefWorker._build_rollout (v0.6.0 lines 568-569, v0.7.0 609-610) builds the
    rollout and model config dataclasses; before v0.6.0 the legacy worker reads the DictConfig as is."""
    if not since("0.6.0"):
        return
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(config.actor_rollout_ref.model, dataclass_type=HFModelConfig)


# --- the engine worker (v0.8.0 on) --------------------------------------------------------------------------

def engine_dataclasses(config, use_ref: bool) -> None:
    """The model and rollout config dataclasses, and the reference's after the key renaming
    engine_workers.ActorRolloutRefWorker.init_model does (v0.8.0 lines 507-513, v0.9.1 lines 545-552)."""
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    arr = config.actor_rollout_ref
    omega_conf_to_dataclass(arr.model)
    omega_conf_to_dataclass(arr.rollout)
    if use_ref:
        ref = arr.ref.copy()
        with open_dict(ref):
            ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
            ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
            ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
            ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
        omega_conf_to_dataclass(ref)


def _micro_split(size: int, micro: int | None, what: str) -> None:
    """verl/workers/engine/utils.py prepare_micro_batches, run on a TensorDict of the per-GPU size: it asserts
    size % micro == 0 (v0.7.1 on); a micro of None (a deprecated global key at v0.8.0) fails in it too."""
    import torch
    from tensordict import TensorDict
    from verl.workers.engine.utils import prepare_micro_batches

    data = TensorDict({"input_ids": torch.zeros(size, 1)}, batch_size=[size])
    data.set_non_tensor("micro_batch_size_per_gpu", micro)
    data.set_non_tensor("use_dynamic_bsz", False)
    try:
        prepare_micro_batches(data)
    except Exception as exc:
        raise Rejected(what, f"{size} samples per GPU in micro batches of {micro}: {exc!r}") from None


def engine_worker(config, use_critic: bool) -> None:
    """Raise Rejected where the engine worker's asserts refuse the config: its Ray-actor methods need a GPU process
    group, so the asserts of init_model and TrainingWorker.train_mini_batch are restated."""
    world = config.trainer.n_gpus_per_node * config.trainer.nnodes
    arr = config.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    # engine_workers.py init_model (v0.8.0 line 557, v0.9.1 line 616).
    if actor.use_dynamic_bsz != rollout.log_prob_use_dynamic_bsz:
        raise Rejected("engine_dynamic_bsz_match", "actor.use_dynamic_bsz != rollout.log_prob_use_dynamic_bsz")
    # init_model (v0.9.0 lines 629-631, v0.9.1 lines 635-637; not in v0.8.0): the per-GPU micro keys are set.
    if since("0.9.0") and not actor.use_dynamic_bsz and (rollout.log_prob_micro_batch_size_per_gpu is None
                                                         or actor.ppo_micro_batch_size_per_gpu is None):
        raise Rejected("engine_per_gpu_micro_required", "a *_micro_batch_size_per_gpu key is None")
    # init_model (v0.8.0 lines 596-601, v0.9.1 lines 655-661): the rollout mesh.
    infer_world = (rollout.tensor_model_parallel_size * rollout.data_parallel_size
                   * rollout.pipeline_model_parallel_size)
    if world % infer_world:
        raise Rejected("engine_rollout_world", f"world {world} % rollout world {infer_world}")
    n = rollout.n
    passes = [("actor", actor.ppo_mini_batch_size, actor.ulysses_sequence_parallel_size,
               actor.use_dynamic_bsz, actor.ppo_micro_batch_size_per_gpu)]
    if use_critic:
        critic = config.critic
        passes.append(("critic", critic.ppo_mini_batch_size, critic.ulysses_sequence_parallel_size,
                       critic.use_dynamic_bsz, critic.ppo_micro_batch_size_per_gpu))
    # v0.8.0 hands a deprecated global micro-batch key on as None: engine_workers.py init_model (lines 563-570)
    # copies only the *_per_gpu keys into the engine config (no per-GPU normalisation, no assert until v0.9.0), and
    # prepare_micro_batches then fails on None at the first step.
    if not actor.use_dynamic_bsz:
        for key, micro in (("actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
                           ("rollout.log_prob_micro_batch_size_per_gpu", rollout.log_prob_micro_batch_size_per_gpu)):
            if micro is None:
                raise Rejected("engine_global_micro_key_unread", f"{key} is None (a deprecated global key is set)")
    for role, mini, sp, dynamic, micro in passes:
        # The FSDP engine's (dp, sp) device mesh (verl/workers/engine/fsdp): sp must divide the world.
        if world % sp:
            raise Rejected("engine_ulysses_mesh", f"{role}: world {world} % ulysses sp {sp}")
        dp = world // sp
        # TrainingWorker.train_mini_batch (v0.8.0 lines 257-260, v0.9.1 lines 266-270).
        if (mini * n) % dp:
            raise Rejected("engine_mini_batch_split", f"{role}: global mini {mini * n} % dp {dp}")
        if not dynamic:
            _micro_split((mini * n) // dp, micro, "engine_micro_batch_split")
    if not actor.use_dynamic_bsz:
        dp = world // actor.ulysses_sequence_parallel_size
        per_gpu = config.data.train_batch_size * n // dp
        if per_gpu:
            _micro_split(per_gpu, rollout.log_prob_micro_batch_size_per_gpu, "engine_log_prob_split")
    agent_loop(config)  # the rollout is always async (the agent loop) from v0.7.0
