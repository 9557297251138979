"""Which values are secrets, so that none reaches a plan, a printed line, `--json` or a rendered script.

A launch script's own `export WANDB_API_KEY=...`, an `HF_TOKEN` a Ray runtime env passes on, a password for an
experiment tracker: `import verl` (and `compare` / `calibrate`, which import scripts) keeps each as a reference,
`${oc.env:NAME}`, which verl's Hydra config resolves from the environment it runs in, and says so. The process
environment is already never copied (planner/shell_expand.py); this module names what else is one: a variable or
key whose name says it holds a credential, or a value shaped like one of the common token formats.

Names are matched on their words, not their letters: MAX_TOKEN_LEN, ppo_max_token_len_per_gpu and max_token are counts,
HF_TOKEN and github_token are credentials; PROMPT_KEY names a column, WANDB_API_KEY a credential.
"""

from __future__ import annotations

import re

# The last word(s) of a credential's name (case-insensitive; words split by _ . - or a lower-to-upper change).
_SECRET_ENDINGS = ("token", "secret", "password", "passwd", "pass", "credential", "credentials", "apikey",
                   "api key", "access key", "secret key", "private key", "auth key", "auth", "cookie",
                   "session key", "signing key", "client secret", "webhook url")
# A word before "token" that makes the name a count of tokens (verl's recipes write `max_token=20480` and pass it
# as ppo_max_token_len_per_gpu), not a credential.
_COUNT_WORDS = ("max", "min", "num", "n", "total", "avg", "mean", "per")
# Words that make any name a credential's wherever they stand.
_SECRET_WORDS = ("secret", "password", "passwd", "apikey", "credential", "credentials")
# Token formats: Hugging Face, OpenAI / Anthropic style, GitHub, GitLab, Slack, AWS access key ids (a W&B key is 40 hex, like a git commit: known by its name only).
_TOKEN_VALUE = re.compile(
    r"(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|glpat-[A-Za-z0-9_\-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})"
)


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [word for word in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if word]


def is_secret_name(name: str) -> bool:
    """Whether a variable or key (its last dotted part) is named as a credential."""
    words = _words(name.rpartition(".")[2])
    if not words:
        return False
    if any(word in _SECRET_WORDS for word in words):
        return True
    if len(words) >= 2 and words[-1] == "token" and words[-2] in _COUNT_WORDS:
        return False
    tail = " ".join(words)
    return any(tail == ending or tail.endswith(" " + ending) for ending in _SECRET_ENDINGS)


def looks_like_token(value: str) -> bool:
    """Whether a value is shaped like a credential of a common service (the whole value, or one word of it)."""
    return any(_TOKEN_VALUE.fullmatch(part) for part in re.split(r"[\s=:,;\"']+", value) if part)


def is_secret(name: str, value: str | None = None) -> bool:
    return is_secret_name(name) or (value is not None and looks_like_token(value))


def reference(name: str) -> str:
    """What a plan keeps in place of a secret: the reference verl's Hydra config resolves where it runs."""
    return "${oc.env:" + name + "}"
