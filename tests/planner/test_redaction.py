"""Which names and values are credentials (planner/redaction.py): words, not letters, decide."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.redaction import is_secret, is_secret_name, looks_like_token, reference

CREDENTIALS = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "github_token",
               "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "DB_PASS", "hfToken", "SLACK_WEBHOOK_URL",
               "+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN", "client_secret", "TOKEN"]
# Counts, lengths and columns that share letters with credentials: verl scripts name them this way.
NOT_CREDENTIALS = ["MAX_TOKEN_LEN", "ppo_max_token_len_per_gpu", "max_tokens", "n_tokens", "TOKENIZERS_PARALLELISM",
                   "PROMPT_KEY", "reward_key", "PWD", "PASSES", "tokenizer", "AWS_ACCESS_KEY_ID", "passthrough",
                   "data.prompt_key", "use_dynamic_bsz", "log_prob_max_token_len_per_gpu", "max_token", "MAX_TOKEN", "num_token", "minToken"]


@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_credentials_name_is_a_secret(name):
    assert is_secret_name(name) and is_secret(name, "anything")


@pytest.mark.parametrize("name", NOT_CREDENTIALS)
def test_a_count_or_column_named_with_a_credentials_letters_is_not(name):
    assert not is_secret_name(name) and not is_secret(name, "16384")


@pytest.mark.parametrize("value", ["hf_" + "a1B2" * 9, "sk-proj-" + "x" * 30, "ghp_" + "Z" * 36, "AKIA" + "A" * 16,
                                   "xoxb-1234567890-abc", "token=hf_" + "q" * 34])
def test_a_value_shaped_like_a_token_is_a_secret_whatever_its_name(value):
    assert looks_like_token(value) and is_secret("RUN_NAME", value)


@given(st.from_regex(r"[a-z0-9./_-]{0,40}", fullmatch=True).filter(lambda v: not v.startswith(("hf_", "sk-"))))
def test_paths_and_run_names_are_not_tokens(value):
    assert not looks_like_token(value)


def test_the_reference_is_what_verls_hydra_resolves_from_its_environment():
    assert reference("HF_TOKEN") == "${oc.env:HF_TOKEN}"
