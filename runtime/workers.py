"""Ray actors: one trainer worker per rank, one rollout worker per vLLM engine.

The trainer worker is a thin shell over the per-rank trainers (actor, critic):
it joins the process group, runs the phase it is asked for under a timer and a
memory probe, and does its part of the weight sync and of checkpointing. The
controller (runtime.loop) only ever talks to these actors.

Cluster: `--address`/RAY_ADDRESS joins a running cluster (multi-node is Ray's
job); otherwise a local one is started on loopback only (127.0.0.2, which Ray
does not rewrite to the external address), with no dashboard, a small object
store and token auth off.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from attrs import frozen

from rlplan.planner.phases import SyncMode
from rlplan.planner.plan import Plan
from rlplan.planner.platform import Platform

if TYPE_CHECKING:
    import torch

    from rlplan.runtime.metrics import PhaseMeasurement
    from rlplan.runtime.rollout.engine import GeneratedSample
    from rlplan.runtime.trainer.token_batch import TokenBatch

# What a measured phase returns.
T = TypeVar("T")

LOOPBACK_NODE_IP = "127.0.0.2"
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20



def start_ray(address: str | None, platform: Platform, world_size: int) -> bool:
    """Connect to `address` (or RAY_ADDRESS), else start a loopback-only local cluster. True if we started it."""
    import ray

    from rlplan.runtime.ray_session import NO_FIRST_DRIVER_PRESTART

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    # On a CPU machine every trainer rank and the rollout engine is one logical CPU, whatever the core count.
    cpus = None if platform.has_accelerator else world_size + 1
    ray.init(
        _node_ip_address=LOOPBACK_NODE_IP,
        include_dashboard=False,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        num_cpus=cpus,
        log_to_driver=False,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}},
        # ray.init would otherwise wait, unwatched, for a first worker that may die at start (runtime.ray_session).
        _system_config=NO_FIRST_DRIVER_PRESTART,
    )
    return True


class RemoteMethod(Protocol):
    """A method of a Ray actor handle: `.remote(...)` queues the call and returns the ObjectRef to `ray.get`."""

    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


class TrainerHandle(Protocol):
    """A TrainerWorker as the controller holds it: a Ray handle whose methods are called with `.remote`."""

    rendezvous: RemoteMethod
    setup: RemoteMethod
    compute_log_probs: RemoteMethod
    compute_ref_log_probs: RemoteMethod
    compute_values: RemoteMethod
    update_actor: RemoteMethod
    update_critic: RemoteMethod
    push_weights: RemoteMethod
    save_checkpoint: RemoteMethod
    load_checkpoint: RemoteMethod
    shutdown: RemoteMethod


class RolloutHandle(Protocol):
    """A RolloutWorker as the controller and the trainers hold it (a Ray handle)."""

    generate: RemoteMethod
    sync_full_weights: RemoteMethod
    sync_lora_adapter: RemoteMethod
    supports_sleep: RemoteMethod
    sleep: RemoteMethod
    wake_up: RemoteMethod
    shutdown: RemoteMethod


@frozen(kw_only=True)
class RendezVous:
    address: str
    port: int


class TrainerWorker:
    """One trainer rank (a Ray actor): the actor model, and the critic when the plan uses one."""

    def __init__(self, plan: Plan, rank: int, world_size: int, platform: Platform) -> None:
        import torch

        self.plan = plan
        self.rank = rank
        self.world_size = world_size
        self.platform = platform
        if platform.has_accelerator:
            # Ray exposes this actor's GPU as device 0.
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        else:
            # Ranks split the machine's cores, so they neither fight over them nor leave them idle.
            from rlplan.runtime.platform import cpu_threads_per_rank

            torch.set_num_threads(cpu_threads_per_rank(world_size))
            self.device = torch.device("cpu")
        self.policy: Any = None
        self.critic: Any = None

    def rendezvous(self) -> RendezVous:
        """Rank 0's address and a free port there, for the process group."""
        import ray

        from rlplan.runtime.trainer.local_group import free_port

        address = "127.0.0.1" if not self.platform.has_accelerator else ray.util.get_node_ip_address()
        return RendezVous(address=address, port=free_port(address))

    def setup(self, rendezvous: RendezVous) -> None:
        from rlplan.runtime.trainer.critic import CriticTrainer
        from rlplan.runtime.trainer.local_group import init_process_group
        from rlplan.runtime.trainer.policy import PolicyTrainer

        if not self.platform.has_accelerator:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        init_process_group(
            self.rank, self.world_size, rendezvous.address, rendezvous.port, self.platform.process_group_backend
        )
        options = {"device": self.device, "device_type": self.platform.device_type, "rank": self.rank}
        self.policy = PolicyTrainer(self.plan, **options)
        if self.plan.uses_critic:
            self.critic = CriticTrainer(self.plan, **options)

    def _measured(self, work: Callable[[], T]) -> tuple[T, PhaseMeasurement]:
        from rlplan.runtime.metrics import measured

        return measured(self.platform.device_type, work)

    # --- phases -------------------------------------------------------------------------------
    def compute_log_probs(self, batch: TokenBatch) -> tuple[tuple[torch.Tensor, torch.Tensor], PhaseMeasurement]:
        return self._measured(lambda: self.policy.compute_log_probs(batch))

    def compute_ref_log_probs(self, batch: TokenBatch) -> tuple[torch.Tensor, PhaseMeasurement]:
        return self._measured(lambda: self.policy.compute_ref_log_probs(batch))

    def compute_values(self, batch: TokenBatch) -> tuple[torch.Tensor, PhaseMeasurement]:
        return self._measured(lambda: self.critic.compute_values(batch))

    def update_actor(self, batch: TokenBatch, step: int) -> tuple[dict[str, float], PhaseMeasurement]:
        return self._measured(lambda: self.policy.update(batch, step))

    def update_critic(self, batch: TokenBatch, step: int) -> tuple[dict[str, float], PhaseMeasurement]:
        return self._measured(lambda: self.critic.update(batch, step))

    # --- weight sync ----------------------------------------------------------------------------
    def push_weights(self, rollouts: list[RolloutHandle], what: SyncMode) -> tuple[dict[str, float], PhaseMeasurement]:
        return self._measured(lambda: self._push_weights(rollouts, what))

    def _push_weights(self, rollouts: list[RolloutHandle], what: SyncMode) -> dict[str, float]:
        """Collective gather; rank 0 hands the result to every rollout engine (`what`: see SyncMode)."""
        import time

        import ray

        from rlplan.runtime.weights import adapter_config, adapter_tensors, iter_hf_weights

        start = time.perf_counter()
        if what == SyncMode.ADAPTER:
            payload: Any = adapter_tensors(self.policy.model)
        else:
            dtype = _torch_dtype(self.plan.rollout.dtype)
            named = iter_hf_weights(
                self.policy.model,
                mode=what,
                layered=self.plan.rollout.layered_summon,
                dtype=dtype,
            )
            payload = [(name, tensor) for name, tensor in named]
        gather_seconds = time.perf_counter() - start
        load_seconds = 0.0
        if self.rank == 0:
            reference = ray.put(payload)
            if what == SyncMode.ADAPTER:
                config = adapter_config(self.policy.model)
                calls = [r.sync_lora_adapter.remote(reference, config) for r in rollouts]
            else:
                calls = [r.sync_full_weights.remote(reference) for r in rollouts]
            load_seconds = max(ray.get(calls), default=0.0)
        return {"gather_seconds": gather_seconds, "load_seconds": float(load_seconds)}

    # --- checkpoints ----------------------------------------------------------------------------
    def _trained_models(self) -> list[tuple[str, Any]]:
        return [("actor", self.policy)] + ([("critic", self.critic)] if self.critic is not None else [])

    def save_checkpoint(self, directory: str) -> None:
        from pathlib import Path

        from rlplan.runtime import checkpoint

        path = Path(directory)
        for name, trainer in self._trained_models():
            checkpoint.save_training_state(path, name, trainer.model, trainer.optimizer, trainer.scheduler, self.rank)
        if self.plan.model.lora.enabled:
            checkpoint.export_adapter(path, self.policy.model, self.rank)
        else:
            dtype = _torch_dtype(self.plan.rollout.dtype)
            checkpoint.export_hf_model(path, self.policy.model, self.plan.model.path, self.rank, dtype=dtype)

    def load_checkpoint(self, directory: str) -> None:
        from pathlib import Path

        from rlplan.runtime import checkpoint

        for name, trainer in self._trained_models():
            checkpoint.load_training_state(
                Path(directory), name, trainer.model, trainer.optimizer, trainer.scheduler, self.rank
            )

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


class RolloutWorker:
    """One vLLM engine (a Ray actor), wrapping the rollout helper's VllmRollout."""

    def __init__(self, model_dir: str, plan: Plan, seed: int) -> None:
        from rlplan.runtime.rollout.engine import VllmRollout

        if _device_type() == "cpu":
            use_every_core()
        self.engine = VllmRollout(model_dir, plan, seed=seed, lora_rank=plan.model.lora.rank)

    def generate(
        self, prompts: list[list[int]], n: int, max_tokens: int, greedy: bool = False
    ) -> tuple[list[GeneratedSample], PhaseMeasurement]:
        from rlplan.runtime.metrics import measured

        return measured(
            _device_type(), lambda: self.engine.generate(prompts, n, max_tokens=max_tokens, greedy=greedy)
        )

    def sync_full_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> float:
        return float(self.engine.sync_full_weights(named_tensors))

    def sync_lora_adapter(self, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> float:
        return float(self.engine.sync_lora_adapter(tensors, config))

    def supports_sleep(self) -> bool:
        return bool(self.engine.supports_sleep)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def shutdown(self) -> None:
        self.engine.shutdown()


def use_every_core() -> None:
    """Give this process's torch and OpenMP every core the machine lets it run on.

    Ray starts an actor that asks for no CPU with OMP_NUM_THREADS=1, and vLLM keeps an OMP_NUM_THREADS it
    finds; the CPU engine generates while the trainer ranks wait (runtime.platform.cpu_threads_per_rank),
    so one thread left half of a 2-core machine idle during every rollout (issue 12). It must run before
    the engine starts: vLLM's CPU worker then turns torch.set_num_threads into a no-op.
    """
    import torch

    from rlplan.runtime.platform import available_cores

    cores = available_cores()
    os.environ["OMP_NUM_THREADS"] = str(cores)
    torch.set_num_threads(cores)


def _device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@frozen(kw_only=True)
class WorkerGroup:
    """The run's actors and the placement group holding them."""

    trainers: list[TrainerHandle]
    rollouts: list[RolloutHandle]
    placement_group: Any

    def shutdown(self) -> None:
        import ray

        # The engines first, then the trainers.
        handles: list[RolloutHandle | TrainerHandle] = [*self.rollouts, *self.trainers]
        for handle in handles:
            try:
                ray.get(handle.shutdown.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to release
                pass
        for handle in handles:
            ray.kill(handle)
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)


def rollout_replicas(plan: Plan, platform: Platform) -> int:
    """One engine per GPU (TP 1, checked at start); one engine for a whole CPU machine, whatever its TP."""
    return plan.cluster.world_size if platform.has_accelerator else 1


def create_workers(plan: Plan, platform: Platform, on_stage: Callable[[str], None] | None = None) -> WorkerGroup:
    """One trainer actor per rank in a placement group, and the rollout engines beside them; `on_stage` hears
    what is starting (the run's spinner). Every wait is bounded (runtime.ray_session.wait_for): workers that die
    at start end it with their cause, and the actors started so far are killed."""
    say = on_stage or (lambda text: None)
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rlplan.runtime.ray_session import SessionLogs, wait_for

    logs = SessionLogs.of_this_session()
    world = plan.cluster.world_size
    if platform.has_accelerator:
        # Trainer and rollout share each GPU (colocated, like verl's hybrid engine): half a GPU each to Ray.
        bundle = {"GPU": 1, "CPU": 1}
        trainer_resources = {"num_gpus": 0.5, "num_cpus": 0.5}
        rollout_resources = {"num_gpus": 0.5, "num_cpus": 0.5}
    else:
        bundle = {"CPU": 1}
        trainer_resources = {"num_cpus": 1}
        rollout_resources = {"num_cpus": 0}
    group = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
    started: list[Any] = []

    def in_bundle(index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)

    def start_rollouts() -> list[RolloutHandle]:
        rollout_class = ray.remote(RolloutWorker)
        engines = [rollout_class.options(scheduling_strategy=in_bundle(replica), **rollout_resources).remote(
            plan.model.path, plan, plan.trainer.seed + replica) for replica in range(rollout_replicas(plan, platform))]
        started.extend(engines)
        return engines

    try:
        wait_for([group.ready()], "reserving the trainers' CPUs (placement group)", logs=logs)
        trainer_class = ray.remote(TrainerWorker)
        trainers = [trainer_class.options(scheduling_strategy=in_bundle(rank), **trainer_resources).remote(
            plan, rank, world, platform) for rank in range(world)]
        started.extend(trainers)
        # On a CPU the engine starts (vLLM's import, the model, the KV space) while the trainers build theirs; on
        # GPUs it starts after them, as verl's hybrid engine does, since vLLM sizes its pool from what is free.
        rollouts = None if platform.has_accelerator else start_rollouts()
        loading = f"loading the model on {world} trainer rank{'s' if world > 1 else ''}"
        say(loading + ("" if rollouts is None else " while vLLM builds its engine"))
        (rendezvous,) = wait_for([trainers[0].rendezvous.remote()], loading, logs=logs)
        wait_for([t.setup.remote(rendezvous) for t in trainers], loading, logs=logs)
        if rollouts is None:
            rollouts = start_rollouts()
        say("vLLM is building its engine (model, KV cache" + ("" if plan.rollout.enforce_eager else ", compiled "
            "kernels") + "; up to a minute or two on a CPU)")
        # A Ray actor's first call waits for its __init__: without this the engine's start-up (~14 s for the
        # 8-layer model on 2 cores) was charged to the first step's wall time, outside every phase it timed.
        wait_for([r.supports_sleep.remote() for r in rollouts], "building the vLLM engine", logs=logs)
    except BaseException:
        for handle in started:
            ray.kill(handle)
        remove_placement_group(group)
        raise
    return WorkerGroup(trainers=trainers, rollouts=rollouts, placement_group=group)
