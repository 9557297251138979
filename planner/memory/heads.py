"""The loss head per kernel: bytes per token x vocab of each head verl (or rlplan's runtime) runs, with and
without grad, per entropy variant, and the lm_head's backward after it."""

from __future__ import annotations

from attrs import frozen

from rlplan.planner.memory.model_facts import ModelFacts, model_facts
from rlplan.planner.plan import RECIPES, Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.stack import root_reshards_after_forward

# What each kernel holds per token x vocab, read from the code verl runs
# (verl/workers/actor/dp_actor.py::_forward_micro_batch, verl/utils/torch_functional.py,
# flash_attn/ops/triton/cross_entropy.py) and measured on its memory twin
# (runtime/head_twins.py: an autograd Function or verl's own torch code that allocates and saves
# what the GPU kernel does, under FSDPMemTracker on fake tensors).  Logits leave the model in bf16
# (2 bytes per T V; transformers no longer upcasts them) and are divided by the temperature in
# place, so every GPU head starts from one bf16 T x V tensor.  Each number is the slope of the
# tracker's peak between 4096 and 8192 tokens (tests/runtime/test_measure.py holds them to the
# twins), keyed by the entropy verl computes beside the log-probs ("none": entropy_coeff 0):
#
#   flash_attn_ce   forward allocates three fp32 values per row and saves the logits themselves;
#                   backward writes dlogits into them when inplace_backward, which verl sets only
#                   without entropy: 2.  With entropy the gradient takes a second bf16 buffer (2 + 2)
#                   and verl's entropy adds: eager 10 (softmax's saved output, then logsumexp's and
#                   softmax's backward temporaries and the summed gradient), the same under
#                   torch.utils.checkpoint (the recomputed softmax is saved again before its
#                   backward); chunked, see below.
#   torch_logprob   logprobs_from_logits_v2 on bf16 logits: one saved log_softmax row per token (2),
#                   its row gradients freed into one stacked gradient as they are built: 2 + 2; the
#                   entropy adds 12 eager or checkpointed; chunked, see below.
#   compiled        torch.compile(entropy_from_logits) (actor.use_torch_compile, verl's default);
#                   dynamo runs eagerly under a tracker, so its twin (head_twins.compiled_entropy) is measured. It
#                   fuses softmax, logsumexp and the sum into row reductions, saves its input (the
#                   logits, counted) and writes one bf16 gradient: + 2 on the head's entropy-blocked
#                   backward.  Checkpointing or chunking a compiled function leaves that unchanged.
#   fused           model.use_fused_kernels computes log-probs and entropy from the hidden states
#                   block by block inside the lm_head: no T x V tensor at all.
#   chunked         rlplan's bundled runtime (runtime/algorithms/lean_head.py): bf16 logits and
#                   their bf16 gradient, plus one of its 16 row chunks' fp32 work, entropy or not.
#   naive           rlplan's former fp32 head: tracker-measured coefficients in the Profile
#                   (memory-model.md 2.4).
#
# The no_grad passes hold the logits (2); the old-log-prob pass computes the entropy too (verl logs
# it): eager and checkpointed add softmax's output and pd * logits (+ 4); compiled adds nothing
# (a fused reduction).
#
# verl's chunked entropy (entropy_from_logits_with_chunking, 2048-row chunks, in fp32) is no fixed
# coefficient: every chunk's fp32 copy and softmax stay saved until backward (8 per T V), while one
# chunk's backward works on 20 bytes per row x V, and from the second chunk on the slices' full-size
# bf16 gradients accumulate (2 more per T V).  Beside the flash (non in-place, 2 + 2) or row-wise
# (4) log-prob head, the twins measure 30 / 20 / 15 / 14 bytes per T V at 2048 / 4096 / 8192 / 16384
# tokens; priced as max(10 T + 20 r, 12 T + 16 r) V with r = min(T, 2048) (exact at 2048, 4096 and
# 16384, +7 % at 8192).  Without grad one chunk at a time: (2 T + 12 r) V, exact at every T.
#
# The temperature, after the kernel's backward.  Between the model and the head verl runs, in every
# version read (dp_actor._forward_micro_batch v0.3 to main; the engine worker's prepare_model_outputs
# from v0.6, there with a per-token temperature tensor):
#     logits_rmpad = output.logits.squeeze(0)    # a view
#     logits_rmpad.div_(temperature)             # in place, on a view of a tensor that requires grad
# Autograd rebases the view: the model output's grad_fn becomes CopySlices around the division's
# backward.  That node runs once the head's own backward has freed everything it saved, and holds at
# once four logits-sized bf16 buffers: the gradient the head produced (flash-attn's in-place one is the
# logits' own storage), a base-sized copy of it (new_empty_strided + copy_), the slice's contiguous
# clone handed to the division, and the division's output; it returns the copy, which the lm_head's
# backward then reads (lm_head_backward_bytes).  Without remove padding verl divides the output itself,
# no view: the gradient and the quotient, two buffers.  Under no_grad the division costs nothing.  So
# an update's head holds the larger of its kernel's stage (the tables below) and this one: 8 per T V
# packed, which is above flash-attn's in-place 2, the row-wise 4 and the compiled entropy's 6, and
# below the eager, checkpointed and chunked entropies.  verl's fused kernels take the temperature
# inside the kernel and rlplan's own heads (chunked, naive) divide nothing in place: no such stage.

_NO_ENTROPY = "none"
ENTROPY_CHUNK_ROWS = 2048
# The heads verl runs on its (bf16) logits after the in-place division by the temperature.
VERL_LOGITS_HEADS = ("flash_attn_ce", "torch_logprob")
_LOGITS_BYTES_PER_TOKEN_VOCAB = 2.0
# The buffers the division's backward holds at once (see above): packed (a view of the output) or padded.
_TEMPERATURE_BACKWARD_BUFFERS = {
    True: ("gradient from the head", "CopySlices' base-sized copy", "the slice's clone", "the quotient"),
    False: ("gradient from the head", "the quotient"),
}
# The kernels' own stage: log-probs and entropy, forward and backward, from the bf16 logits.
UPDATE_HEAD_BYTES: dict[str, dict[str, float]] = {
    "flash_attn_ce": {_NO_ENTROPY: 2.0, "eager": 14.0, "checkpointed": 14.0, "compiled": 6.0},
    "torch_logprob": {_NO_ENTROPY: 4.0, "eager": 16.0, "checkpointed": 16.0, "compiled": 6.0},
    "fused": dict.fromkeys((_NO_ENTROPY, "eager", "checkpointed", "chunked", "compiled"), 0.0),
    "chunked": dict.fromkeys((_NO_ENTROPY, "eager", "checkpointed", "chunked", "compiled"), 4.75),
}
_GPU_HEAD_FORWARD_BYTES = {_NO_ENTROPY: 2.0, "eager": 6.0, "checkpointed": 6.0, "compiled": 2.0}
FORWARD_HEAD_BYTES: dict[str, dict[str, float]] = {
    "flash_attn_ce": _GPU_HEAD_FORWARD_BYTES,
    "torch_logprob": _GPU_HEAD_FORWARD_BYTES,
    "fused": UPDATE_HEAD_BYTES["fused"],
    "chunked": {_NO_ENTROPY: 2.25, **dict.fromkeys(("eager", "checkpointed", "chunked", "compiled"), 2.75)},
}


def temperature_backward_bytes_per_token_vocab(head: str, *, packed: bool = True) -> float:
    """What the backward of verl's in-place division by the temperature holds at once, per T V (see above)."""
    if head not in VERL_LOGITS_HEADS:
        return 0.0
    return _LOGITS_BYTES_PER_TOKEN_VOCAB * len(_TEMPERATURE_BACKWARD_BUFFERS[packed])


def head_bytes_per_token_vocab(head: str, entropy: str, *, grad: bool, tokens: int, packed: bool = True) -> float:
    """The peak bytes per token x vocab of a GPU head (not "naive") as autograd runs verl's sequence, at
    `tokens` per micro batch: its kernel's own stage, then under grad the temperature's backward after it.

    `entropy` is verl's entropy variant ("none": log-probs only); `packed` is remove padding."""
    if entropy == "chunked" and head in VERL_LOGITS_HEADS:
        kernel = chunked_entropy_head_bytes_per_token_vocab(tokens, grad=grad)
    else:
        kernel = (UPDATE_HEAD_BYTES if grad else FORWARD_HEAD_BYTES)[head][entropy]
    if not grad:
        return kernel
    return max(kernel, temperature_backward_bytes_per_token_vocab(head, packed=packed))


def resolved_loss_head(plan: Plan) -> str:
    """The head kernel the plan is priced with: its own choice, or what its runtime would run ("auto")."""
    head = plan.actor.loss_head
    return head if head != "auto" else runtime_loss_head(plan)


def runtime_loss_head(plan: Plan) -> str:
    """The head the plan's runtime runs: verl's on GPUs, rlplan's own on its CPU ranks.

    verl's fused kernels replace the head; rlplan's bundled runtime on CPU runs its chunked lean
    head; a GPU plan with remove padding imports flash_attn (bert_padding), so verl's
    logprobs_from_logits finds its triton CE; without it flash-attn may be absent and verl
    falls back to the row-wise torch log-prob.
    """
    if plan.model.use_fused_kernels:
        return "fused"
    if plan.cluster.gpu.is_cpu:
        return "chunked"
    return "flash_attn_ce" if plan.model.use_remove_padding else "torch_logprob"


def entropy_variant(plan: Plan) -> str:
    """How verl computes entropy: compiled unless use_torch_compile is off, then chunked / checkpointed / eager."""
    actor = plan.actor
    if actor.use_torch_compile:
        return "compiled"
    if actor.entropy_from_logits_with_chunking:
        return "chunked"
    return "checkpointed" if actor.entropy_checkpointing else "eager"


def root_gathered_at_head(plan: Plan) -> bool:
    """Whether FSDP2 still holds the root group (lm_head, final norm, a tied embedding) gathered while the
    head's kernel runs.  verl's logits heads run on `output.logits` after the model's forward returns, so on a
    stack whose torch reshards the root after the forward (stack.ROOT_RESHARDS_AFTER_FORWARD) the lm_head is
    sharded again by then; the fused kernels run inside the forward (verl patches the model's forward), where
    the root is gathered on every stack."""
    return resolved_loss_head(plan) == "fused" or not root_reshards_after_forward(plan.stack, plan.rollout.name)


# verl's fused kernels (verl/utils/kernel/kernels.py, default BackwardEnum._Split_Dlogits_N) build the
# logits' gradient one vocab split of this many columns at a time, in bf16, beside bf16 d_hidden / d_weight.
FUSED_DLOGITS_SPLIT_VOCAB = 9504


def lm_head_backward_bytes(plan: Plan, facts: ModelFacts, tokens: int) -> float:
    """What the lm_head's backward holds at once: the logits' bf16 gradient (one vocab split of it for
    the fused kernels) and the weight's bf16 gradient (none for a LoRA actor, whose lm_head is frozen).
    Where a head holds little more than the logits (flash-attn's in-place CE, fused) this is its peak."""
    weight_grad = 0 if plan.model.lora.enabled else 2 * facts.vocab * facts.hidden
    columns = min(facts.vocab, FUSED_DLOGITS_SPLIT_VOCAB) if resolved_loss_head(plan) == "fused" else facts.vocab
    return 2 * tokens * columns + weight_grad


def chunked_entropy_head_bytes_per_token_vocab(tokens: int, *, grad: bool) -> float:
    """A GPU log-prob head with verl's chunked entropy beside it, at `tokens` per micro batch (see above)."""
    t = max(1, tokens)
    rows = min(t, ENTROPY_CHUNK_ROWS)
    if grad:
        return max(10 * t + 20 * rows, 12 * t + 16 * rows) / t
    return (2 * t + 12 * rows) / t


def _entropy_priced(plan: Plan, entropy: bool) -> str:
    return entropy_variant(plan) if entropy else _NO_ENTROPY


def actor_head_bytes_per_token_vocab(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, tokens: int) -> float:
    """Bytes per token x vocab the update's head holds at `tokens` per micro batch; verl computes entropy
    only when entropy_coeff != 0."""
    head = resolved_loss_head(plan)
    entropy = plan.actor.entropy_coeff != 0
    if head == "naive":
        if not entropy:
            return profile.head_log_prob_bytes
        if plan.actor.entropy_from_logits_with_chunking:
            return profile.head_chunked_entropy_bytes
        return profile.head_entropy_bytes
    return head_bytes_per_token_vocab(head, _entropy_priced(plan, entropy), grad=True, tokens=tokens,
                                      packed=plan.model.use_remove_padding)


def forward_head_bytes_per_token_vocab(plan: Plan, profile: Profile = DEFAULT_PROFILE, *,
                                       entropy: bool, tokens: int) -> float:
    """The no_grad head of the old-log-prob (entropy computed) and ref (log-probs only) passes."""
    head = resolved_loss_head(plan)
    if head == "naive":
        return profile.head_forward_only_bytes
    return head_bytes_per_token_vocab(head, _entropy_priced(plan, entropy), grad=False, tokens=tokens)


@frozen
class LossHead:
    """What the update's loss head holds at one micro batch, for a training backend to place in its step."""

    bytes_per_token_vocab: float
    # rlplan's former fp32 head asks for fp32 blocks the cached bf16 logits block cannot serve.
    fp32: bool
    lm_head_backward_bytes: float


# SPIN's update head (plan.RECIPES "spin"; recipe/spin/dp_actor.py update_policy_dpo_with_ref and
# core_algos.get_batch_logps, the same at v0.4.1-v0.7.0), per token x vocab of the micro batch's chosen and
# rejected halves, read from the code (no memory twin measures it yet). Per half, under bf16 autocast: the
# model's bf16 logits (2, held by the output object to the micro batch's end), the shifted contiguous copy (2),
# cross entropy's fp32 cast (4) and its saved fp32 log_softmax (4); after the call the logits and the
# log_softmax stay (6). The forward's peak is the second half's call beside the first's 6: (6 + 12) / 2 = 9; the
# backward's is one half's log_softmax backward (its fp32 output gradient and input gradient, 4 + 4) beside
# both halves' 6: 6 + 8 / 2 = 10. No temperature division (the update never divides), no entropy.
SPIN_PAIR_HEAD_BYTES = 10.0


def update_loss_head(plan: Plan, profile: Profile, tokens: int) -> LossHead:
    """The actor update's head at `tokens` per micro batch."""
    recipe = plan.algorithm.recipe
    if recipe is not None and RECIPES[recipe].pair_update:
        return LossHead(bytes_per_token_vocab=SPIN_PAIR_HEAD_BYTES, fp32=False,
                        lm_head_backward_bytes=lm_head_backward_bytes(plan, model_facts(plan.model.arch), tokens))
    return LossHead(
        bytes_per_token_vocab=actor_head_bytes_per_token_vocab(plan, profile, tokens=tokens),
        fp32=resolved_loss_head(plan) == "naive",
        lm_head_backward_bytes=lm_head_backward_bytes(plan, model_facts(plan.model.arch), tokens),
    )
