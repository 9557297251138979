"""The controller's on-policy step: no old-log-prob pass, and the same update and metrics as with it.

One real trainer rank (FSDP2 on gloo) behind stand-ins for the Ray handles, and a scripted rollout
engine, so the step runs without Ray or vLLM: the code under test is runtime/loop.py's step.
"""

from __future__ import annotations

import attrs
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

pytestmark = pytest.mark.runtime


class _Handle:
    """`handle.method.remote(*args)` runs `obj.method(*args)` here; `ray.get` is the identity in these ranks."""

    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        method = getattr(self._obj, name)
        return type("Remote", (), {"remote": staticmethod(method)})


class _Trainer:
    def __init__(self, policy) -> None:
        self.policy = policy
        self.calls: list[str] = []

    def _measured(self, name, work):
        from rlplan.runtime.metrics import measured

        self.calls.append(name)
        return measured("cpu", work)

    def compute_log_probs(self, batch):
        return self._measured("compute_log_probs", lambda: self.policy.compute_log_probs(batch))

    def update_actor(self, batch, step):
        return self._measured("update_actor", lambda: self.policy.update(batch, step))

    def push_weights(self, engines, what):
        return self._measured("push_weights", lambda: {"gather_seconds": 0.0, "load_seconds": 0.0})


class _Engine:
    """Scripted samples: response j of prompt p is 2 + (p + j) % 5 tokens, with made-up sampling log-probs."""

    def generate(self, prompts, n, max_tokens):
        from rlplan.runtime.metrics import measured
        from rlplan.runtime.rollout.engine import GeneratedSample

        def samples():
            out = []
            for p, prompt in enumerate(prompts):
                for j in range(n):
                    response = tuple(7 + (p * 13 + j * 5 + k) % 200 for k in range(2 + (p + j) % 5))
                    out.append(GeneratedSample(prompt_index=p, prompt_ids=tuple(prompt), response_ids=response,
                                               response_logprobs=tuple(-1.0 for _ in response), finish_reason="stop"))
            return out

        return measured("cpu", samples)


class _Data:
    pad_token_id = 0
    size = 64

    def next_batch(self):
        from types import SimpleNamespace

        return [SimpleNamespace(index=i, prompt_ids=[5 + i, 9, 11 + 3 * i, 40]) for i in range(4)]

    def score(self, record, response_ids):
        # Depends on the response, so groups have spread and advantages are non-zero.
        return float(len(response_ids) % 3) + 0.1 * record.index


def _one_step(rank: int, world_size: int, model_dir: str, output_dir: str, skip_pass: bool) -> dict:
    from types import SimpleNamespace

    import ray
    import torch

    from rlplan.planner.platform import Platform
    from rlplan.runtime.demo_workload import demo_plan
    from rlplan.runtime.loop import Controller, RunOptions
    from rlplan.runtime.trainer.policy import PolicyTrainer

    ray.get = lambda value: value
    plan = demo_plan(model_dir, "unused.parquet", output_dir, steps=1, world_size=1, algorithm="grpo_full",
                     train_batch_size=4, n=4)
    # One mini batch of all 16 sequences, no KL: an on-policy update.
    plan = plan.evolve(actor=attrs.evolve(plan.actor, ppo_mini_batch_size=4, use_kl_loss=False))
    trainer = _Trainer(PolicyTrainer(plan, device=torch.device("cpu"), device_type="cpu", rank=rank))
    workers = SimpleNamespace(trainers=[_Handle(trainer)], rollouts=[_Handle(_Engine())])
    controller = Controller(plan, Platform(device_type="cpu"), RunOptions(output_dir=output_dir), workers, _Data())
    assert controller.on_policy
    controller.on_policy = skip_pass
    record = controller.step(1)
    return {"record": record, "calls": trainer.calls}


def test_on_policy_step_skips_the_old_log_prob_pass_with_the_same_update_and_metrics(tiny_model_dir, tmp_path):
    from rlplan.runtime.trainer.local_group import run_on_local_group

    (skipped,) = run_on_local_group(_one_step, 1, tiny_model_dir, str(tmp_path / "a"), True)
    (with_pass,) = run_on_local_group(_one_step, 1, tiny_model_dir, str(tmp_path / "b"), False)
    assert skipped["calls"] == ["update_actor", "push_weights"]
    assert with_pass["calls"] == ["compute_log_probs", "update_actor", "push_weights"]
    fast, slow = skipped["record"], with_pass["record"]
    assert "time/old_log_prob" not in fast and "memory/old_log_prob_peak_gib" not in fast
    assert "time/old_log_prob" in slow
    assert fast["advantages_abs_mean"] > 0.1
    for key in ("actor/pg_loss", "actor/grad_norm", "sync_logprob_gap", "entropy", "reward_mean"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-4, abs=1e-6), key
    assert fast["actor/grad_norm"] > 0 and fast["sync_logprob_gap"] > 0.1
