"""What a launch script shows of its target stack (`rlplan import verl`), and where a verdict differs across it.

Evidence, each narrowing the verl releases the script can have been written for (stack.VERL_RELEASES):
- a key the script sets (`key=value`, not `+key` / `++key`, which add keys) that only some releases' trainer config
  has, dated by the per-release key inventory read from verl's own configs (planner/verl_inventory.py);
- a value a release refuses (stack.REMOVED_KEYS: `rollout.mode=sync` before v0.7.0);
- an advantage estimator only some releases register (the inventory's estimators);
- the shell's own exports and command prefixes (read through shell_lexer.shell_commands, so a commented-out line
  does not count): `VLLM_USE_V1=0` or `VLLM_ATTENTION_BACKEND=XFORMERS` select vLLM's V0 engine, which vLLM 0.11
  removed and so no verl from 0.9.0 (vLLM >= 0.18) installs; `VLLM_USE_V1=1` selects V1.
- what the command's trainer needs of verl (a `stack.Behaviour` each: the SPIN and SPPO recipes' modules exist in
  some releases only, `stack.SPIN_SPPO_RECIPES`);
- the verl the command runs: `python -m verl...` imports the `verl` package of the folder it runs in first, so an
  import from the root of a verl source tree reads that tree's `verl/version/version` (`0.4.1`; a tag's `0.7.0.dev`
  or main's `0.8.0.dev` as that release): the release that runs, which the other evidence cannot overrule (what
  disagrees with it is said).
The stack is the newest release all the evidence allows (verl's later releases are the likelier target), with the
oldest kept as `stack.verl_oldest` so that `verdicts_across` can say where rules or memory judge the range apart.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
from attrs import frozen

from rlplan.planner import verl_inventory
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile
from rlplan.planner.shell_lexer import shell_commands
from rlplan.planner.stack import (
    DEFAULT_VERL,
    REMOVED_KEYS,
    VERL_RELEASES,
    VLLM_V0_ENGINE,
    VLLM_V0_REMOVED,
    Behaviour,
    StackSection,
    default_engine_version,
    engine_pins,
    in_range,
    parse_version,
)
from rlplan.planner.verl_keys import ROLLOUT_ENGINE_SINCE, ROLLOUT_NAME_KEY

ADV_ESTIMATOR_KEY = "algorithm.adv_estimator"
# The vLLM a V0 script on a verl whose default vLLM has no V0 is judged with: the last release verl 0.4.0-0.5.0
# allowed (vllm<=0.8.5), which verl 0.6.1-0.8.0's extras allow too.
VLLM_V0_ERA = "0.8.5"
VLLM_V1_DEFAULT_SINCE = VLLM_V0_ENGINE.before or "0.8.0"
_V0_SWITCHES = {("VLLM_USE_V1", "0"), ("VLLM_ATTENTION_BACKEND", "XFORMERS")}


@frozen(kw_only=True)
class Evidence:
    """One thing the script shows: the verl releases it allows, and why, in words."""

    releases: frozenset[str]
    why: str


@frozen(kw_only=True)
class InferredStack:
    stack: StackSection
    reasons: tuple[str, ...]


def span_text(releases: Iterable[str]) -> str:
    """`0.4.0-0.9.0` for a run of consecutive releases, else the releases listed."""
    chosen = sorted(releases, key=parse_version)
    if not chosen:
        return "none"
    first, last = VERL_RELEASES.index(chosen[0]), VERL_RELEASES.index(chosen[-1])
    if list(VERL_RELEASES[first:last + 1]) == chosen:
        return chosen[0] if first == last else f"{chosen[0]}-{chosen[-1]}"
    return ", ".join(chosen)


def _merged(runs: Iterable[tuple[str | None, str | None]]) -> list[tuple[str | None, str | None]]:
    """Runs that meet (one ends where the next starts: the inventory splits a key's run where its default
    changes) joined into one."""
    merged: list[tuple[str | None, str | None]] = []
    for since, before in sorted(runs, key=lambda run: parse_version(run[0] or "0")):
        if merged and merged[-1][1] == since:
            merged[-1] = (merged[-1][0], before)
        else:
            merged.append((since, before))
    return merged


def _runs_text(runs: Iterable[tuple[str | None, str | None]]) -> str:
    parts = []
    for since, before in _merged(runs):
        arrived = f"arrived in {since}" if since and since != VERL_RELEASES[0] else ""
        removed = f"was removed in {before}" if before else ""
        parts.append(" and ".join(part for part in (arrived, removed) if part) or "is in every release")
    return "; ".join(parts)


def key_evidence(keys: Iterable[str], backend: verl_inventory.TrainerBackend) -> list[Evidence]:
    """Evidence from the keys a script sets as written (`key=value`): those only some releases' config has."""
    found = []
    for key in keys:
        runs = verl_inventory.key_runs(key, backend)
        if not runs:  # a key no release's YAML has (an added `+` key, a typo): no evidence either way
            continue
        allowed = frozenset(r for r in VERL_RELEASES if verl_inventory.has_key(r, key, backend))
        if allowed != frozenset(VERL_RELEASES):
            found.append(Evidence(releases=allowed, why=f"`{key}` {_runs_text((s, b) for s, b, _ in runs)}"))
    return found


def needs_evidence(needs: Iterable[Behaviour]) -> list[Evidence]:
    """Evidence from what the command's trainer needs: the releases where each behaviour holds."""
    return [Evidence(releases=frozenset(r for r in VERL_RELEASES if behaviour.holds_for(r)),
                     why=f"it needs what {behaviour.name} says: {behaviour.summary}") for behaviour in needs]


def installed_evidence(version_text: str | None) -> list[Evidence]:
    """Evidence from the verl the command would run: the `verl/version/version` text of the folder it runs in
    (None: no verl source tree there). A `.dev` version is the release it names; one rlplan does not know, none."""
    if not version_text or not version_text.strip():
        return []
    written = version_text.strip().splitlines()[0].strip()
    release = written if written in VERL_RELEASES else written.partition(".dev")[0]
    if release not in VERL_RELEASES:
        return []
    return [Evidence(releases=frozenset({release}), why=f"`python -m verl...` runs the verl of the folder it runs in, "
                                                         f"whose verl/version/version says {written}")]


def value_evidence(values: dict[str, str]) -> list[Evidence]:
    """Evidence from values only some releases accept: a value verl refuses from some release on, an estimator."""
    found = []
    for era in REMOVED_KEYS:
        value = next((v for k, v in values.items() if k.lstrip("+") == era.key), None)
        if value is not None and era.value is not None and value.strip("'\"") == era.value:
            allowed = frozenset(r for r in VERL_RELEASES if in_range(r, era.since, era.before))
            found.append(Evidence(releases=allowed, why=f"`{era.key}={era.value}` ({era.why})"))
    engine = values.get(ROLLOUT_NAME_KEY, "").strip("'\"")
    if (since := ROLLOUT_ENGINE_SINCE.get(engine)) is not None:
        found.append(Evidence(releases=frozenset(r for r in VERL_RELEASES if in_range(r, since, None)),
                              why=f"`{ROLLOUT_NAME_KEY}={engine}`: verl builds that rollout from {since}"))
    estimator = values.get(ADV_ESTIMATOR_KEY)
    if estimator is not None:
        name = estimator.strip("'\"")
        runs = verl_inventory.estimator_runs(name)
        allowed = frozenset(r for r in VERL_RELEASES if name in verl_inventory.estimators_of(r))
        if runs and allowed != frozenset(VERL_RELEASES):
            found.append(Evidence(releases=allowed, why=f"`{ADV_ESTIMATOR_KEY}={name}`: the estimator "
                                                        f"{_runs_text(runs)}"))
    return found


def script_exports(script: str) -> dict[str, str]:
    """The environment the script's own commands set: `export NAME=VALUE`, `env NAME=VALUE cmd` and `NAME=VALUE
    cmd` prefixes, in order (the last wins). Comments are not commands, so a commented-out export is not read."""
    exported: dict[str, str] = {}
    for words in shell_commands(script):
        rest = words[1:] if words and words[0] in ("export", "env") else words
        for word in rest:
            name, equals, value = word.partition("=")
            if not equals or not name.replace("_", "").isalnum() or name[0].isdigit():
                break
            exported[name] = value.strip("'\"")
    return exported


def engine_evidence(exported: dict[str, str]) -> tuple[str | None, str, list[Evidence]]:
    """(vLLM engine the exports select or None, the export that does, evidence about verl)."""
    for name, value in exported.items():
        if (name, value.upper()) in _V0_SWITCHES:
            allowed = frozenset(r for r in VERL_RELEASES
                                if parse_version(engine_pins(r, "vllm")[0] or "0") < parse_version(VLLM_V0_REMOVED))
            why = (f"`{name}={value}` selects vLLM's V0 engine, which vLLM {VLLM_V0_REMOVED} removed; verl "
                   f"{span_text(set(VERL_RELEASES) - allowed)} install{'s' if len(VERL_RELEASES) - len(allowed) == 1 else ''}"
                   " no vLLM that has it")
            return "v0", f"{name}={value}", [Evidence(releases=allowed, why=why)]
    if exported.get("VLLM_USE_V1") == "1":
        return "v1", "VLLM_USE_V1=1", []
    return None, "", []


def _binding_text(evidence: list[Evidence], span: list[str]) -> str:
    """The evidence that sets the span's ends (a release just outside it lacks what the script shows), the rest
    counted."""
    first, last = VERL_RELEASES.index(span[0]), VERL_RELEASES.index(span[-1])
    outside = [VERL_RELEASES[i] for i in (first - 1, last + 1) if 0 <= i < len(VERL_RELEASES)]
    binding = [e for e in evidence if any(release not in e.releases for release in outside)] or evidence[:1]
    rest = len(evidence) - len(binding)
    return "; ".join(e.why for e in binding) + (f" (and {rest} more that agree)" if rest else "")


def infer_stack(written: dict[str, str], script: str, backend: verl_inventory.TrainerBackend,
                engine: str, installed: str | None = None, needs: tuple[Behaviour, ...] = ()) -> InferredStack | None:
    """The stack a script shows, with why; None when it shows nothing.

    `written`: the overrides as the script writes them (key as spelled, `+`/`++` prefixes kept; value text).
    verl: the newest release all evidence allows, `verl_oldest` the oldest where that leaves a range; evidence that
    contradicts itself leaves verl at the default, said. vLLM: V0 (and a vLLM that has it) where the script's
    exports select it. `installed`: the verl/version/version text of the folder the command runs in (it decides).
    `needs`: what the command's trainer needs of verl (needs_evidence).
    """
    plain = [key for key in written if not key.startswith(("+", "~"))]
    runs_here = installed_evidence(installed)
    evidence = runs_here + key_evidence(plain, backend) + value_evidence(written) + needs_evidence(needs)
    vllm_engine, switch, engine_found = engine_evidence(script_exports(script)) if engine == "vllm" else (None, "", [])
    evidence += engine_found
    if not evidence and vllm_engine is None:
        return None
    reasons = []
    changes: dict[str, str | None] = {}
    if evidence:
        # Scripts from verl's main between two releases can show both (rollout.mode=sync beside a key 0.7.0
        # added): the releases that agree with the most evidence, and what they do not agree with, are said.
        candidates = [r for r in VERL_RELEASES if not runs_here or r in runs_here[0].releases]
        agreeing = {r: [e for e in evidence if r in e.releases] for r in candidates}
        most = max(len(agreed) for agreed in agreeing.values())
        ordered = [r for r in candidates if len(agreeing[r]) == most]
        changes["verl"] = ordered[-1]
        changes["verl_oldest"] = ordered[0] if len(ordered) > 1 else None
        taken = f"; taken as {ordered[-1]}, the newest" if len(ordered) > 1 else ""
        reasons.append(f"judged as verl {span_text(ordered)}: {_binding_text(agreeing[ordered[-1]], ordered)}{taken}")
        against = [e.why for e in evidence if e not in agreeing[ordered[-1]]]
        if against:
            reasons.append("no verl release has all the script shows (a script from verl's main between releases?); "
                           f"these do not hold on verl {span_text(ordered)}: {'; '.join(against)}")
    verl = changes.get("verl") or DEFAULT_VERL
    vllm = default_engine_version(verl, "vllm")
    if vllm_engine == "v1" and parse_version(vllm) >= parse_version(VLLM_V1_DEFAULT_SINCE):
        vllm_engine = None  # V1 is that vLLM's default anyway: nothing to say
    if vllm_engine is not None:
        if vllm_engine == "v0" and parse_version(vllm) >= parse_version(VLLM_V0_REMOVED):
            vllm = VLLM_V0_ERA
            changes["vllm"] = vllm
        changes["vllm_engine"] = vllm_engine
        reasons.append(f"vLLM {vllm} with its {vllm_engine.upper()} engine: the script exports {switch}")
    if not reasons:
        return None
    return InferredStack(stack=StackSection(**changes), reasons=tuple(reasons))  # type: ignore[arg-type]


def verdicts_across(plan: Plan, profile: Profile | None = None) -> list[str]:
    """Where an imported plan's verl range (stack.verl_oldest to stack.verl) is judged apart: each run of releases
    with the same rule errors, and the memory verdict at both ends. Empty when the plan holds no range or every
    release gets the same verdict."""
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.profile import DEFAULT_PROFILE
    from rlplan.planner.rules import check_plan

    oldest, newest = plan.stack.verl_oldest, plan.stack.verl
    if oldest is None or oldest == newest:
        return []
    releases = [r for r in VERL_RELEASES if in_range(r, oldest, None) and parse_version(r) <= parse_version(newest)]
    runs: list[tuple[list[str], tuple[str, ...]]] = []
    for release in releases:
        errors = tuple(sorted({v.rule for v in check_plan(on_release(plan, release)).errors}))
        if runs and runs[-1][1] == errors:
            runs[-1][0].append(release)
        else:
            runs.append(([release], errors))
    lines = []
    if len(runs) > 1:
        lines.append(f"the rules judge verl {span_text(releases)} apart: " + "; ".join(
            f"on {span_text(group)} " + (f"refused by {', '.join(errors)}" if errors else "valid")
            for group, errors in runs))
    memory = {release: predict_memory(on_release(plan, release), profile or DEFAULT_PROFILE)
              for release in (oldest, newest)}
    if memory[oldest].fits != memory[newest].fits:
        lines.append("the memory verdict differs across the range: " + "; ".join(
            f"on verl {release} it {'fits' if report.fits else 'does not fit'}"
            + ("" if report.rollout.starts else
               f" and vLLM {on_release(plan, release).stack.version_of('vllm')} refuses to start")
            + " (peak "
            f"{report.gpu_peak_bytes / 2**30:.1f} GiB, KV cache {report.kv_cache_bytes / 2**30:.1f} GiB)"
            for release, report in memory.items()))
    return lines


def on_release(plan: Plan, release: str) -> Plan:
    """The plan judged on another verl release of its range: that release's engine versions, unless the plan
    named its own (a V0 vLLM stays what the script chose)."""
    stack = attrs.evolve(plan.stack, verl=release, verl_oldest=None)
    return plan.evolve(stack=stack)
