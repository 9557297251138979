"""A measured Megatron-Core training step on the CPU: Megatron's own GPTModel, DDP grad buffer and distributed
optimizer, run on tiny real tensors over gloo, one process per rank, inside PyTorch's MemTracker.

The FSDP twins (runtime/emulation.py) measure FSDP2 on fake tensors in one process. Megatron's MoE token
dispatcher sizes its all-to-all from the routing (data-dependent splits), which fake tensors cannot carry, so
this twin runs small real models instead, over a real gloo group of `world` processes (torch.multiprocessing
spawn), and the planner prices the same tiny architecture (benchmarks/megatron_twin.py holds the two side by
side). Every tensor a rank creates is counted with its real size, per moment of the step (forward, loss head,
the head's and the layers' backward, the optimizer step, verl's offload and reload between phases,
verl's no-grad log-prob pass).

What it runs, from megatron-core (PyPI 0.16.1, the version the twin installs; imported inside functions only,
so the runtime does not need it): GPTModel on the local (non-Transformer-Engine) layer spec, tensor parallel
with sequence parallelism, the 1F1B pipeline schedule, the MoE layer with its router and the all-to-all token
dispatcher over EP, full recompute (tensor_parallel.checkpoint), DistributedDataParallel with its contiguous
fp32 grad buffer, and get_megatron_optimizer's DistributedOptimizer (or the plain mixed-precision optimizer).

What it patches, for the run only (`cpu_megatron`): the CUDA calls Megatron makes unconditionally (device
"cuda" in factory calls and `.to`, torch.cuda streams / events / RNG state, `Tensor.type()`'s "torch.cuda."
names the optimizer checks), the local norm's refusal of sequence parallelism (the norm is the same
torch RMSNorm; its weight is marked sequence-parallel as TE's is), the dispatcher's device-to-host copy of its
split sizes (already on the host), and a missing `te_general_gemm` name in the router without TE.

What it cannot cover, and how the rows say so: Transformer Engine's modules (the GPU runs TE linear layers,
TE's flash attention and TE's RMSNorm; here core attention is torch's SDPA, whose CPU flash kernel saves the
query, key, value, output and log-sum-exp as flash attention does, and the linears are Megatron's own
ColumnParallelLinear / RowParallelLinear), grouped GEMM (the experts run as SequentialMLP, which saves the
same per-token tensors), context parallelism (Megatron's CP needs TE's attention), the fused Adam kernels (TE
/ Apex are absent, so get_megatron_optimizer falls back to torch.optim.AdamW, whose temporaries differ: the
twin runs it single-tensor and foreach and reports both), NCCL's own buffers and the CUDA caching
allocator's rounding and fragmentation (never torch tensors).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.plan import MegatronSection

# The moments of one training step the tracker tells apart (planner/phases.py's vocabulary, per moment).
MOMENTS = ("forward", "loss", "loss_backward", "backward", "optimizer", "log_prob", "offloaded", "reload")


@frozen
class TwinModel:
    """A tiny Qwen-like decoder (SwiGLU, RMSNorm, rotary, grouped KV heads, untied), dense or MoE."""

    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 704
    vocab: int = 4096
    experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    qk_norm: bool = False

    def architecture(self) -> Architecture:
        """The planner's view of the same model."""
        return Architecture(
            family="qwen3_moe" if self.experts else "qwen2", hidden_size=self.hidden, num_layers=self.layers,
            num_attention_heads=self.heads, num_kv_heads=self.kv_heads, head_dim=self.hidden // self.heads,
            intermediate_size=self.ffn, vocab_size=self.vocab, qk_norm=self.qk_norm, num_experts=self.experts,
            num_experts_per_token=self.top_k, moe_intermediate_size=self.moe_ffn)


@frozen
class TwinCase:
    """One measured layout: the model, the ranks and Megatron's knobs as verl sets them."""

    label: str
    model: TwinModel
    world: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    seq: int = 1024
    micro_batches: int = 2
    recompute: Literal["full", "selective"] | None = None  # "full" (uniform, recompute_num_layers) or None
    recompute_num_layers: int = 1
    recompute_method: Literal["uniform", "block"] = "uniform"
    distributed_optimizer: bool = True
    foreach: bool = True  # torch AdamW's multi-tensor path (the GPU's without TE / Apex; the CPU default is the loop)
    offload: bool = False  # verl's offload of params, grads and optimizer after the step, then the reload
    # then verl's no-grad log-prob pass (its compute_log_prob): with the entropy beside the log-probs (the
    # old-log-prob pass) or without (the reference's)
    log_prob: Literal["entropy", "log_probs"] | None = None
    first_stage_layers: int | None = None  # Megatron's num_layers_in_first_pipeline_stage (uneven PP)
    last_stage_layers: int | None = None

    def engine(self) -> MegatronSection:
        return MegatronSection(
            tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
            expert_model_parallel_size=self.ep, expert_tensor_parallel_size=1 if self.model.experts else None,
            sequence_parallel=self.tp > 1, use_distributed_optimizer=self.distributed_optimizer,
            recompute_granularity=self.recompute, recompute_method=self.recompute_method if self.recompute else None,
            recompute_num_layers=self.recompute_num_layers if self.recompute else None)

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TwinCase:
        return cls(**{**data, "model": TwinModel(**data["model"])})


# --- the run: one process per rank ---------------------------------------------------------------------------


def measure(case: TwinCase, timeout_s: float = 900.0) -> list[dict[str, Any]]:
    """Every rank's measurement of `case` (spawned processes over gloo on loopback), rank order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="megatron_twin_") as folder:
        port = _free_port()
        context = mp.start_processes(_rank_main, args=(case.as_json(), folder, port), nprocs=case.world,
                                     join=False, start_method="spawn")
        while not context.join(timeout=timeout_s):
            pass
        return [json.loads((Path(folder) / f"rank{rank}.json").read_text()) for rank in range(case.world)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rank_main(rank: int, case_json: dict[str, Any], folder: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    case = TwinCase.from_json(case_json)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=case.world)
    try:
        with cpu_megatron():
            result = _measure_rank(case, rank)
        Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _measure_rank(case: TwinCase, rank: int) -> dict[str, Any]:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=case.tp, pipeline_model_parallel_size=case.pp,
        expert_model_parallel_size=case.ep, expert_tensor_parallel_size=1)
    tracker = _stage_tracker()
    with tracker:
        model, ddp, optimizer = _build(case)
        built = tracker.current()
        step = _StepRunner(case, model, ddp, optimizer, tracker)
        step.run()  # iteration 1: Adam's moments are created in its step
        tracker.reset_peaks()
        state, parts = tracker.current(), _state_parts(ddp, optimizer)
        step.run()
        after_step = tracker.current()
        if case.log_prob:
            step.log_prob_pass(entropy=case.log_prob == "entropy")
        peaks = dict(tracker.peaks)
        if case.offload:
            tracker.stage = "offloaded"
            moved, grads = _offload(ddp, optimizer)
            peaks["offloaded"] = tracker.current()
            tracker.stage = "reload"
            _reload(moved, grads)
            peaks["reload"] = tracker.peaks.get("reload", tracker.current())
    return {"rank": rank, "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
            "built": built, "state": state, "after_step": after_step, "peaks": peaks, "parts": parts}


def _build(case: TwinCase) -> tuple[Any, Any, Any]:
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig, transformer_block

    model_spec = case.model
    moe = dict(num_moe_experts=model_spec.experts, moe_router_topk=model_spec.top_k,
               moe_ffn_hidden_size=model_spec.moe_ffn, expert_model_parallel_size=case.ep,
               expert_tensor_parallel_size=1, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
               moe_router_load_balancing_type="none") if model_spec.experts else {}
    recompute = dict(recompute_granularity="full", recompute_method=case.recompute_method,
                     recompute_num_layers=case.recompute_num_layers) if case.recompute else {}
    uneven = {key: value for key, value in (("num_layers_in_first_pipeline_stage", case.first_stage_layers),
                                            ("num_layers_in_last_pipeline_stage", case.last_stage_layers))
              if value is not None}
    # verl's TransformerConfig (verl/models/mcore/config_converter.py): bf16, no dropout, RMSNorm, SwiGLU,
    # no linear biases; the fp32 DDP grad buffer of verl's get_model (grad_reduce_in_fp32=True).
    config = TransformerConfig(
        num_layers=model_spec.layers, hidden_size=model_spec.hidden, num_attention_heads=model_spec.heads,
        num_query_groups=model_spec.kv_heads, ffn_hidden_size=model_spec.ffn, kv_channels=model_spec.hidden // model_spec.heads,
        tensor_model_parallel_size=case.tp, pipeline_model_parallel_size=case.pp, sequence_parallel=case.tp > 1,
        use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True, pipeline_dtype=torch.bfloat16,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, qk_layernorm=model_spec.qk_norm, bias_activation_fusion=True,
        **moe, **recompute, **uneven)
    model_parallel_cuda_manual_seed(0)
    spec = get_gpt_layer_local_spec(num_experts=model_spec.experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=model_spec.qk_norm)
    spec.submodules.self_attention.submodules.core_attention = _flash_attention_class()
    norm = _fused_rms_norm_class()
    transformer_block.LayerNormImpl = norm  # the final norm of the last stage
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = norm
    if model_spec.qk_norm:
        spec.submodules.self_attention.submodules.q_layernorm = norm
        spec.submodules.self_attention.submodules.k_layernorm = norm
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=model_spec.vocab,
                     max_sequence_length=case.seq, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(), position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=case.distributed_optimizer, overlap_grad_reduce=False),
        model)
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-6, weight_decay=0.01, bf16=True, params_dtype=torch.bfloat16,
        use_distributed_optimizer=case.distributed_optimizer, clip_grad=1.0), [ddp])
    if case.foreach:
        for inner in _inner_optimizers(optimizer):
            for group in inner.param_groups:
                group["foreach"] = True
    return model, ddp, optimizer


def _inner_optimizers(optimizer: Any) -> list[Any]:
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [megatron_optimizer.optimizer for megatron_optimizer in chained]


class _StepRunner:
    """One training iteration as verl's megatron actor runs it: Megatron's forward_backward_func over the
    micro batches (1F1B under PP), then the optimizer's step; the tracker's stage follows the schedule."""

    def __init__(self, case: TwinCase, model: Any, ddp: Any, optimizer: Any, tracker: Any) -> None:
        import torch

        self.case, self.model, self.ddp, self.optimizer, self.tracker = case, model, ddp, optimizer, tracker
        generator = torch.Generator().manual_seed(1)
        self.tokens = torch.randint(0, case.model.vocab, (1, case.seq), generator=generator)
        self.positions = torch.arange(case.seq).unsqueeze(0)
        output_layer = getattr(model, "output_layer", None)
        if output_layer is not None:
            # The output layer's backward done: the head's buffers are gone, the layers' backward begins.
            output_layer.register_full_backward_hook(lambda *args: self._enter("backward"))

    def _enter(self, stage: str) -> None:
        self.tracker.stage = stage

    def run(self) -> None:
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func, schedules

        last = parallel_state.is_pipeline_last_stage()
        original_backward = schedules.backward_step

        def backward_step(*args: Any, **kwargs: Any) -> Any:
            self._enter("loss_backward" if last else "backward")
            return original_backward(*args, **kwargs)

        def forward_step(data_iterator: Any, model: Any) -> Any:
            self._enter("forward")
            output = model(self.tokens, self.positions, None, labels=self.tokens)

            def loss_func(per_token_loss: Any) -> Any:
                self._enter("loss")
                loss = per_token_loss.float().sum() / per_token_loss.numel()
                return loss, {"loss": loss.detach()}

            return output, loss_func

        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        schedules.backward_step = backward_step
        try:
            get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(()), model=[self.ddp],
                                        num_microbatches=self.case.micro_batches, seq_length=self.case.seq,
                                        micro_batch_size=1, forward_only=False)
        finally:
            schedules.backward_step = original_backward
        self._enter("optimizer")
        self.optimizer.step()
        self._enter("idle")

    def log_prob_pass(self, *, entropy: bool) -> None:
        """verl's compute_log_prob on Megatron without fused kernels (megatron_actor.py forward_backward_batch's
        logits_processor, read at v0.6.0-v0.7.0 and main; the engine worker's, megatron/transformer_impl.py, alike):
        Megatron's forward-only schedule under no_grad, GPTModel's bf16 vocabulary-parallel logits (no labels),
        divided by the temperature in place, then with the entropy the logits cloned (`logits_bak`) and verl's
        vocab_parallel_entropy of them, and the log-probs as Megatron-Core's vocab_parallel_cross_entropy of the
        clone (verl's vocab_parallel_log_probs_from_logits). The entropy is computed as verl's
        _VocabParallelEntropy.forward does (verl/utils/megatron/tensor_parallel.py, the same at v0.4.1-main): the
        shifted logits (one bf16 logits-sized tensor) exp'd and divided in place; its torch.compile'd product
        reduction makes no logits-sized tensor, so the twin reduces the product a block of rows at a time."""
        import torch
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def entropy_of(logits: Any) -> Any:
            group = parallel_state.get_tensor_model_parallel_group()
            logits_max = logits.max(dim=-1, keepdim=True).values
            torch.distributed.all_reduce(logits_max, op=torch.distributed.ReduceOp.MAX, group=group)
            softmax = (logits - logits_max).exp_()
            sum_exp = softmax.sum(dim=-1, keepdim=True)
            torch.distributed.all_reduce(sum_exp, group=group)
            softmax.div_(sum_exp)
            products = torch.cat([(softmax[:, rows:rows + 64] * logits[:, rows:rows + 64]).sum(-1, keepdim=True)
                                  for rows in range(0, logits.shape[1], 64)], dim=1)
            torch.distributed.all_reduce(products, group=group)
            return (logits_max + sum_exp.log() - products).squeeze(-1)

        def forward_step(data_iterator: Any, model: Any) -> Any:
            self._enter("log_prob")
            logits = model(self.tokens, self.positions, None)

            def loss_func(output: Any) -> Any:
                output.div_(1.0)  # verl's temperature, in place
                logits_bak, total = output, torch.zeros((), dtype=torch.float32)
                if entropy:
                    logits_bak = output.clone()
                    total = total + entropy_of(output).float().sum()
                total = total - tensor_parallel.vocab_parallel_cross_entropy(logits_bak, self.tokens).sum()
                return total, {"log_probs": total.detach()}

            return logits, loss_func

        with torch.no_grad():
            get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(()), model=[self.ddp],
                                        num_microbatches=self.case.micro_batches, seq_length=self.case.seq,
                                        micro_batch_size=1, forward_only=True)
        self._enter("idle")


def _state_parts(ddp: Any, optimizer: Any) -> dict[str, int]:
    """The rank's persistent state by part, summed from the objects themselves (not the tracker)."""
    import torch

    def nbytes(tensors: Any) -> int:
        seen: dict[int, int] = {}
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    buffers = [*ddp.buffers, *ddp.expert_parallel_buffers]
    main_params: list[Any] = []
    moments: list[Any] = []
    for inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            main_params.extend(group["params"])
        for state in inner.state.values():
            moments.extend(value for key, value in state.items() if key != "step")
    weights = nbytes(buffer.param_data for buffer in buffers if buffer.param_data is not None)
    if not weights:  # without the distributed optimizer the bf16 weights are the parameters themselves
        weights = nbytes(ddp.module.parameters())
    return {"weights": weights, "grads": nbytes(buffer.grad_data for buffer in buffers),
            "main_params": nbytes(param for param in main_params if param.dtype == torch.float32),
            "moments": nbytes(moments)}


# --- verl's offload and reload between phases (verl/utils/megatron_utils.py) ---------------------------------


def _offload(ddp: Any, optimizer: Any) -> tuple[list[tuple[Any, Any]], list[tuple[Any, int]]]:
    """verl's offload_megatron_model_to_cpu and offload_megatron_optimizer: each DDP buffer's param_data copied
    to the host and its GPU storage resized to 0, grad_data freed (resize to 0, never copied), the optimizer's
    fp32 main params and Adam moments moved to the host. Host copies are made outside the tracker (the host is
    not the GPU); returns what the reload puts back."""
    from torch.utils._python_dispatch import _disable_current_modes

    moved: list[tuple[Any, Any]] = []
    grads: list[tuple[Any, int]] = []
    tensors = []
    for buffer in [*ddp.buffers, *ddp.expert_parallel_buffers]:
        if buffer.param_data is not None:
            tensors.append(buffer.param_data)
        grad_storage = buffer.grad_data.untyped_storage()
        grads.append((grad_storage, grad_storage.nbytes()))
        grad_storage.resize_(0)
    for inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            tensors.extend(param for param in group["params"] if param.data_ptr())
        for state in inner.state.values():
            tensors.extend(value for key, value in state.items() if key != "step")
    seen: set[int] = set()
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or not storage.nbytes():
            continue
        seen.add(storage.data_ptr())
        with _disable_current_modes():
            host = storage.clone()
        moved.append((storage, host))
        storage.resize_(0)
    return moved, grads


def _reload(moved: list[tuple[Any, Any]], grads: list[tuple[Any, int]]) -> None:
    """verl's load_megatron_model_to_gpu / load_megatron_optimizer: each storage re-allocated and refilled,
    the grad buffers re-allocated (and zeroed: no copy)."""
    from torch.utils._python_dispatch import _disable_current_modes

    for storage, host in moved:
        storage.resize_(host.nbytes())  # the tracker counts the GPU bytes here
        with _disable_current_modes():  # the copy would count the host copy as a GPU tensor
            storage.copy_(host)
    for storage, size in grads:
        storage.resize_(size)


# --- the tracker -----------------------------------------------------------------------------------------------


def _stage_tracker() -> Any:
    """A dispatch-mode tracker of live storage bytes that keeps the peak of every stage the step enters
    (`stage`). Like MemTracker it counts each storage an op creates once, until the storage dies, and follows
    UntypedStorage.resize_ (verl's offload); unlike it, it installs no module hooks (Megatron's DDP wrapper
    shadows nn.Module.buffers with its list of grad buffers, which MemTracker's hooks call)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class StageTracker(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.stage = "build"
            self.peaks: dict[str, int] = {}
            self.live = 0
            self.sizes: dict[int, list[int]] = {}  # storage id -> [bytes]
            self.refs: dict[int, weakref.ref] = {}
            self._resize = torch.UntypedStorage.resize_

        def current(self) -> int:
            return self.live

        def reset_peaks(self) -> None:
            self.peaks = {}

        def _note(self) -> None:
            if self.live > self.peaks.get(self.stage, -1):
                self.peaks[self.stage] = self.live

        def _track(self, storage: Any) -> None:
            key = id(storage)
            if key in self.refs and self.refs[key]() is storage:
                return
            size = [storage.nbytes()]
            self.sizes[key] = size
            self.live += size[0]

            def drop(_ref: Any, key: int = key, size: list[int] = size) -> None:
                self.live -= size[0]
                if self.sizes.get(key) is size:
                    del self.sizes[key], self.refs[key]

            self.refs[key] = weakref.ref(storage, drop)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor) and value.device.type != "meta":
                    self._track(value.untyped_storage())
            self._note()
            return out

        def __enter__(self) -> Any:
            tracker, resize = self, self._resize

            def resize_(storage: Any, size: int) -> Any:
                result = resize(storage, size)
                entry = tracker.sizes.get(id(storage))
                nbytes = int(storage.nbytes())
                if entry is not None and tracker.refs[id(storage)]() is storage:
                    tracker.live += nbytes - entry[0]
                    entry[0] = nbytes
                    tracker._note()
                return result

            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
            return super().__enter__()

        def __exit__(self, *args: Any) -> None:
            torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
            super().__exit__(*args)

    return StageTracker()


# --- what Megatron-Core needs patched to run on the CPU ----------------------------------------------------------


def _flash_attention_class() -> type:
    """Core attention as flash attention keeps it (TE's DotProductAttention on the GPU): torch's CPU flash
    kernel called as one autograd Function that saves what flash-attn saves, the query, key and value (the
    key and value at their own KV-head count: the kernel's grouped-query expansion is a transient), the output
    and the log-sum-exp, and returns the output as [s, b, heads x dim] without a copy."""
    import torch
    from megatron.core.transformer.module import MegatronModule

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def expand(tensor: Any, groups: int) -> Any:
        return tensor.repeat_interleave(groups, dim=1) if groups > 1 else tensor

    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:  # [b, heads, s, dim]
            groups = q.shape[1] // k.shape[1]
            out, logsumexp = flash(q, expand(k, groups), expand(v, groups), 0.0, True)
            ctx.save_for_backward(q, k, v, out, logsumexp)
            ctx.groups = groups
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            q, k, v, out, logsumexp = ctx.saved_tensors
            groups = ctx.groups
            grad_q, grad_k, grad_v = flash_backward(grad_out.contiguous(), q, expand(k, groups), expand(v, groups),
                                                    out, logsumexp, 0.0, True)
            if groups > 1:
                b, heads, s, dim = grad_k.shape
                grad_k = grad_k.view(b, heads // groups, groups, s, dim).sum(2)
                grad_v = grad_v.view(b, heads // groups, groups, s, dim).sum(2)
            return grad_q, grad_k, grad_v

    class FlashCoreAttention(MegatronModule):
        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     attention_dropout: float | None = None, softmax_scale: float | None = None,
                     cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
            super().__init__(config=config)

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, attn_mask_type: Any = None,
                    attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
            q, k, v = (tensor.permute(1, 2, 0, 3) for tensor in (query, key, value))  # [b, heads, s, dim]
            out = FlashAttention.apply(q, k, v)
            return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)

    return FlashCoreAttention


def _fused_rms_norm_class() -> type:
    """RMSNorm as TE's / Apex's fused kernel keeps it: the input and one fp32 inverse RMS per token saved,
    the fp32 arithmetic transient (torch's decomposed rms_norm saves fp32 copies of the input)."""
    import torch

    class RmsNormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, eps: float) -> Any:
            inverse = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, weight, inverse)
            return (x.float() * inverse).to(x.dtype) * weight

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            x, weight, inverse = ctx.saved_tensors
            normed = x.float() * inverse
            grad_normed = grad.float() * weight.float()
            grad_x = inverse * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
            grad_weight = (grad.float() * normed).reshape(-1, x.shape[-1]).sum(0)
            return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None

    class FusedRMSNorm(torch.nn.Module):
        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> None:
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
            self.weight.sequence_parallel = config.sequence_parallel  # its grads all-reduced over TP, as TE's

        def forward(self, x: Any) -> Any:
            return RmsNormFunction.apply(x, self.weight, self.eps)

    return FusedRMSNorm


@contextlib.contextmanager
def cpu_megatron() -> Iterator[None]:
    """Megatron-Core on the CPU for one rank's run (module docstring: what and why). Not undone: each rank
    is its own spawned process that exits after the measurement."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            device = kwargs.get("device")
            if device is not None and str(device).startswith("cuda"):
                kwargs["device"] = "cpu"
            if getattr(func, "__name__", "") == "to":
                args = tuple("cpu" if isinstance(arg, str | torch.device) and str(arg).startswith("cuda") else arg
                             for arg in args)
            out = func(*args, **kwargs)
            if func is torch.Tensor.type and len(args) == 1 and not kwargs and isinstance(out, str) \
                    and out.startswith("torch.") and not out.startswith("torch.cuda."):
                return "torch.cuda." + out.removeprefix("torch.")
            return out

    class Stream:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def wait_stream(self, *args: Any) -> None:
            pass

        def wait_event(self, *args: Any) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def record_event(self, *args: Any) -> Any:
            return Event()

    class Event(Stream):
        def record(self, *args: Any) -> None:
            pass

        def query(self) -> bool:
            return True

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.Stream = Stream  # type: ignore[assignment,misc]
    torch.cuda.Event = Event  # type: ignore[assignment,misc]
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *args, **kwargs: Stream()  # type: ignore[assignment]
    torch.cuda.default_stream = lambda *args, **kwargs: Stream()  # type: ignore[assignment]
    _patch_megatron()
    with CudaOnCpu():
        yield


def _patch_megatron() -> None:
    import megatron.core.tensor_parallel.random as megatron_random
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher
    import torch

    megatron_random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    megatron_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    if not hasattr(moe_utils, "te_general_gemm"):  # imported from TE, never defined without it
        moe_utils.te_general_gemm = None

    def on_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        return tensor.detach().numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = on_host
