"""Per-GPU memory of every phase of a colocated verl step (an FSDP or Megatron trainer + a vLLM or SGLang
rollout), and host RAM.

The formulas are those of shared/reference/memory-model.md section 2, derived
from the model's architecture (GQA KV width, tied embeddings, gated MLP width,
MoE experts and active experts, vocabulary), never from a parameter count alone.
A step runs the phases memory.phases lists (weight sync, rollout, the log-prob and value passes,
the updates), each reported with its components.

Every component has a scope.  "step" is what the phase itself allocates, the
scope a PyTorch memory tracker measures (memory-model.md 3.6); "resident" is
state other roles or the sleeping engine leave on the GPU; "overhead" is what
no tracker sees: the CUDA context / NCCL budget and the fragmentation reserve.
Component names are stable (the fidelity checks and `explain` key on them):

    actor_params, actor_grads, actor_optimizer_state, optimizer_step_temporaries,
    ref_params, critic_params, critic_grads, critic_optimizer_state,
    activations                 saved activations (checkpointed layer inputs under AC)
    layer_backward_workspace    one layer's activations recomputed / held in backward
    loss_head_hidden            final norm and hidden state at the head, T x (8h + 4)
    logits_head                 the loss head's logits / log-softmax / entropy, c x T x V (c per kernel)
    forward_transients          layer-sized temporaries of a no_grad forward, T x (4h + 6I)
    fsdp_all_gather_buffers     current + prefetched bf16 layer, 2 x 2 N_L
    fsdp_reduce_scatter_buffer  fp32 gradient reduce-scatter input of one layer
    root_group_unsharded        bf16 embedding (+ untied lm_head) gathered in late backward
    lm_head_grads, embedding_grads, tied_summed_grads, embedding_reduce_scatter_buffer, embedding_sharded_grads
                                the root groups' backward after the layers (fsdp.root_backward_components)
    vllm_weights, vllm_activation, vllm_non_torch, kv_cache, cuda_graph_pool,
    vllm_context                what vLLM keeps on the GPU even asleep (context, NCCL)
    sglang_weights, sglang_activation, sglang_non_torch, sglang_context
                                the same for an SGLang rollout (rollout.name = "sglang")
    weight_sync_gather          full tensors / buckets gathered to push into vLLM
    cuda_context_and_nccl, fragmentation_reserve
Host components (per node): actor_params_offloaded, actor_grads_offloaded, actor_optimizer_offloaded,
ref_params_offloaded, critic_params_offloaded, critic_grads_offloaded, critic_optimizer_offloaded,
activations_offloaded, vllm_sleep_weights, model_copy_shm, process_overhead.

Entry points: `predict_memory` (every phase, host, KV budget) and `predict_phase` (one
phase, for searches that bisect one knob), re-exported here with the result types.  Every
other name is imported from the module that owns it:

    memory.report       the result types: Component (and its scope), PhaseMemory, HostMemory,
                        BindingConstraint, a role's per-rank TrainerState; GIB, MIB
    memory.model_facts  ModelFacts of an architecture (per-layer activation bytes, forward
                        transients, largest tensor), cached per Architecture; lora_params
    memory.rollout      the rollout engine's budget (RolloutBudget, rollout_budget: vLLM and SGLang
                        KV cache, weights, workspace), kv_cache_tokens, the CUDA-graph pool,
                        vllm_cpu_kv_space_gib, rollout_max_model_len, what the engine resumes to sync;
                        where engines differ, one EngineMemory record each (ROLLOUT_ENGINES)
    memory.heads        the loss head per kernel (bytes per token x vocab, with and without grad),
                        resolved_loss_head / runtime_loss_head, entropy_variant, the update's LossHead
    memory.backend      the training-backend boundary: the TrainingBackend protocol the phases call,
                        and the backend of a plan's actor.strategy (training_backend)
    memory.fsdp         the FSDP training backend (FsdpBackend): each role's sharded state
                        (actor_state, critic_state, the reference's params, the offload policy, on_gpu),
                        the training step's and a no_grad forward's components, the weight-sync gather
    memory.megatron     the Megatron training backend (MegatronBackend): each role's state on its most
                        loaded rank over TP / PP / EP / ETP and the distributed optimizer, a pipeline
                        stage's activations, the weight-sync gathers
    memory.phases       the step's phases (predict_memory, predict_phase) and their MemoryReport, host
                        memory, at_max_length, longest_expected_response_that_fits
The constants (allocator margins, vLLM workspace fit, head coefficients) come from
the `Profile`, never from literals here.
"""

from rlplan.planner.memory.phases import MemoryReport, predict_memory, predict_phase, predict_phases
from rlplan.planner.memory.report import GIB, Component, PhaseMemory

__all__ = ["GIB", "Component", "MemoryReport", "PhaseMemory", "predict_memory", "predict_phase", "predict_phases"]
