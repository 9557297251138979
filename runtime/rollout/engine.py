"""VllmRollout: the only code in rlplan that touches vLLM.

It generates samples with the log-probs of the sampled tokens, takes the trainer's
weights in place (full weights through vLLM's `reload_weights`, LoRA adapters as a fresh
adapter per sync), and sleeps/wakes where the platform supports it. vLLM is imported
when an engine is built, never at module import.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.rollout import vllm_cpu_kv_space_gib
from rlplan.planner.plan import Plan
from rlplan.runtime.rollout.adapter_files import write_peft_adapter, write_safetensors_weights
from rlplan.runtime.rollout.engine_args import vllm_engine_kwargs, vllm_lora_rank

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@frozen
class GeneratedSample:
    """One sampled response and the rollout policy's log-prob of each of its tokens."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    finish_reason: str


def _prepare_environment(plan: Plan) -> None:
    """Environment vLLM reads at import and engine start; values the user set are kept."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # In-process engine core: `collective_rpc` then hands weight tensors over by reference.
    # The multi-process engine serialises its arguments and turns tensors into lists.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The KV space the planner priced for this plan (rollout_budget on a CPU cluster).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(vllm_cpu_kv_space_gib(plan)))
    # vLLM's default pins OpenMP threads to cores, which collides with the trainer's threads.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _sampled_token_logprobs(token_ids: tuple[int, ...], positions: Any) -> tuple[float, ...]:
    """The log-prob of each sampled token; logprobs=0 returns exactly that entry per position."""
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError(
            "vLLM returned no log-prob for some sampled tokens although the request asked for them"
        )
    values = []
    for position, token in zip(positions, token_ids, strict=True):
        if position is None or token not in position:
            raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}")
        values.append(float(position[token].logprob))
    return tuple(values)


def _scratch_dir(prefix: str) -> Path:
    """A private directory in memory-backed storage where there is one (adapters are rewritten every step)."""
    shm = Path("/dev/shm")
    return Path(
        tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None)
    )


def _release_model_state_held_outside_the_engine(model: Any) -> None:
    """Run in the engine's worker at shutdown: free what vLLM keeps of the model beyond the engine's life.

    - vLLM's layer-wise reload registry (`reload_weights`, a module-level WeakKeyDictionary whose values refer
      back to their layers) keeps every layer, and so the whole model, alive after the engine shuts down.
    - Each CPU linear holds a oneDNN matmul handle that only a finalizer calling into torch frees. Left to the
      garbage collector, that finalizer ran under a test's fake-tensor mode (where it raises and leaks the
      handle) or during interpreter exit. The handles are released here, once, and the finalizer finds none.
    Another vLLM version without these internals has nothing of them to free.
    """
    try:
        from vllm._custom_ops import CPUDNNLGEMMHandler
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return
    for module in model.modules():
        LAYERWISE_INFO.pop(module, None)
        for cell in getattr(getattr(module, "cpu_linear", None), "__closure__", None) or ():
            try:
                handle = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(handle, CPUDNNLGEMMHandler) and handle.handler_tensor is not None:
                handle.dtor(int(handle.handler_tensor.item()))
                handle.handler_tensor = None


class VllmRollout:
    """A vLLM engine serving the policy under training."""

    def __init__(self, model_dir: str, plan: Plan, *, seed: int = 0, lora_rank: int = 0) -> None:
        _prepare_environment(plan)
        import vllm
        from vllm.platforms import current_platform

        self._plan = plan
        self._on_gpu = not current_platform.is_cpu()
        self._lora_rank = lora_rank or plan.model.lora.rank
        # Tensors reach the model by reference only when the engine core and its one worker
        # live in this process; otherwise collective_rpc serialises them (into lists).
        self._weights_by_reference = (
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
            and plan.rollout.tensor_model_parallel_size == 1
        )
        self._logged_once: set[str] = set()
        kwargs = vllm_engine_kwargs(
            plan, str(model_dir), on_gpu=self._on_gpu, seed=seed, lora_rank=self._lora_rank
        )
        if not self._on_gpu:
            self._log_once(
                "cpu-memory",
                "vLLM runs on the CPU: rollout.gpu_memory_utilization does not apply; the KV cache is "
                f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB of host memory.",
            )
        self._llm: vllm.LLM | None = vllm.LLM(**kwargs)
        # With load_format "dummy" the engine starts from random weights until the first full sync.
        self._has_real_weights = plan.rollout.load_format != "dummy"
        self._adapter_root = _scratch_dir("rlplan-rollout-")
        self._adapter_request: Any = None

    # --- facts ------------------------------------------------------------------------------
    @property
    def supports_sleep(self) -> bool:
        """Whether sleep/wake_up free memory: a GPU engine built with plan.rollout.free_cache_engine."""
        return self._on_gpu and self._plan.rollout.free_cache_engine

    @property
    def lora_enabled(self) -> bool:
        return self._lora_rank > 0

    @property
    def needs_full_weights(self) -> bool:
        """True until the first full sync when the engine started from dummy weights."""
        return not self._has_real_weights

    # --- generation -------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_tokens: int,
        greedy: bool = False,
        lora: bool = True,
    ) -> list[GeneratedSample]:
        """n samples per prompt, grouped by prompt in prompt order, with sampling log-probs.

        Sampling uses plan.rollout temperature/top_p/top_k/ignore_eos; greedy=True decodes with
        temperature 0 and needs n == 1. lora=False samples the base model.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.needs_full_weights:
            raise RuntimeError(
                "the rollout engine started with load_format='dummy' and has not received weights yet; "
                "call sync_full_weights first"
            )
        if greedy and n != 1:
            raise ValueError(f"greedy decoding yields one answer per prompt; got n={n}")
        rollout = self._plan.rollout
        if greedy:
            params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, logprobs=0)
        else:
            params = SamplingParams(
                n=n,
                temperature=rollout.temperature,
                top_p=rollout.top_p,
                top_k=rollout.top_k,
                max_tokens=max_tokens,
                ignore_eos=rollout.ignore_eos,
                logprobs=0,
            )
        outputs = self._engine.generate(
            [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts],
            params,
            use_tqdm=False,
            lora_request=self._adapter_request if lora else None,
        )
        samples = []
        for prompt_index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
            for completion in output.outputs:
                response_ids = tuple(completion.token_ids)
                samples.append(
                    GeneratedSample(
                        prompt_index=prompt_index,
                        prompt_ids=tuple(prompt),
                        response_ids=response_ids,
                        response_logprobs=_sampled_token_logprobs(response_ids, completion.logprobs),
                        finish_reason=str(completion.finish_reason),
                    )
                )
        return samples

    # --- weight sync ------------------------------------------------------------------------
    def sync_full_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Load the trainer's weights (Hugging Face names) in place; returns the seconds it took."""
        start = time.perf_counter()
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        if self._weights_by_reference:
            self._engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            # Worker processes cannot receive tensors as RPC arguments; hand them a file.
            weights_dir = _scratch_dir("rlplan-weights-")
            try:
                write_safetensors_weights(weights_dir, weights)
                self._engine.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_dir)})
            finally:
                shutil.rmtree(weights_dir, ignore_errors=True)
        # Cached prefixes hold KV computed with the old weights.
        self._engine.reset_prefix_cache()
        self._has_real_weights = True
        return time.perf_counter() - start

    def sync_lora_adapter(self, adapter_tensors: dict[str, torch.Tensor], peft_config: dict) -> float:
        """Serve a new adapter (peft state-dict names and adapter_config dict); returns seconds.

        Each sync gets a fresh adapter id and directory and the previous one is removed:
        vLLM caches adapters by id, so reusing an id would keep serving the stale adapter.
        """
        from vllm.lora.request import LoRARequest

        if not self.lora_enabled:
            raise PlanError(
                field="model.lora.rank",
                message="the rollout engine was built without LoRA, so it cannot take an adapter.",
                fix="set model.lora.rank > 0 (or pass lora_rank) when the trainer syncs adapters",
            )
        adapter_rank = int(peft_config.get("r", 0))
        if adapter_rank > vllm_lora_rank(self._lora_rank):
            raise PlanError(
                field="model.lora.rank",
                message=f"the adapter has rank {adapter_rank}, the engine serves up to {vllm_lora_rank(self._lora_rank)}.",
                fix="build the rollout with the same model.lora.rank as the trainer",
            )
        start = time.perf_counter()
        previous = self._adapter_request
        adapter_id = previous.lora_int_id + 1 if previous is not None else 1
        adapter_dir = self._adapter_root / f"adapter-{adapter_id}"
        write_peft_adapter(adapter_dir, adapter_tensors, peft_config)
        if previous is not None:
            self._engine.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self._adapter_request = LoRARequest(f"policy-{adapter_id}", adapter_id, str(adapter_dir))
        # Load now, so a bad adapter fails here and the time is part of the sync.
        self._engine.llm_engine.add_lora(self._adapter_request)
        self._engine.reset_prefix_cache()
        return time.perf_counter() - start

    # --- memory -----------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory (plan.rollout.sleep_level); a logged no-op elsewhere."""
        if not self.supports_sleep:
            self._log_once("sleep", self._no_sleep_reason())
            return
        self._engine.sleep(level=self._plan.rollout.sleep_level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back "weights" and/or "kv_cache" (all when tags is None); a logged no-op elsewhere."""
        if not self.supports_sleep:
            self._log_once("sleep", self._no_sleep_reason())
            return
        self._engine.wake_up(tags)

    def shutdown(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            if self._weights_by_reference:  # the model lives in this process (see __init__)
                llm.apply_model(_release_model_state_held_outside_the_engine)
            llm.llm_engine.engine_core.shutdown()
            self._llm = None
            gc.collect()  # the engine's reference cycles go now, while torch is whole, not at interpreter exit
        shutil.rmtree(self._adapter_root, ignore_errors=True)

    # --- helpers ----------------------------------------------------------------------------
    @property
    def _engine(self) -> Any:
        if self._llm is None:
            raise RuntimeError("the rollout engine was shut down")
        return self._llm

    def _no_sleep_reason(self) -> str:
        if not self._on_gpu:
            return "vLLM runs on the CPU, where sleep mode does not exist; sleep/wake_up do nothing."
        return "rollout.free_cache_engine is false, so the engine keeps its memory; sleep/wake_up do nothing."

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged_once:
            self._logged_once.add(key)
            log.warning(message)
