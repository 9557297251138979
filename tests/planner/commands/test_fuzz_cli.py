"""Hostile input never crashes the CLI (issue 11): mutated plans, config.json files, launch scripts and flags.

Every case runs the real command in-process and must end with exit 0, 1 or 2, print no traceback, name a
field when it refuses, finish within a generous deadline (a hang or a quadratic blow-up, not a slow
machine), and change no file but the requested output.  The example count is small by default so the
suite stays fast; `RLPLAN_FUZZ_EXAMPLES=3000` runs a thorough search.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app
from tests.planner.chart_html import inlined_spec

EXAMPLES = int(os.environ.get("RLPLAN_FUZZ_EXAMPLES", "25"))
# The deadline catches hangs and quadratic blow-ups, not a slow shared machine: a case takes well under 5 s.
FUZZ = settings(max_examples=EXAMPLES, deadline=timedelta(seconds=300), derandomize=EXAMPLES <= 25,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

# A refusal is one paragraph "error FIELD: message", validate's table of violated rules (each names its
# keys), or click's usage error naming the option.
# A --json command names the field in its error object: {"error": {"field": ...}}.
NAMES_A_FIELD = re.compile(r"error\s+\S.*?:|\"field\": \"[^\"]+\"|INVALID: \d+ rule violation|.rule.: |Invalid value for|No such option|Missing (option|argument)|"
                           r"requires an argument|Got unexpected extra", re.S)

QWEN_CONFIG = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
               "max_position_embeddings": 32768, "tie_word_embeddings": True}

SEED_SOLVES = {
    "grpo-0.5b": ["--model", "qwen2.5-0.5b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "512",
                  "--response-len", "1024"],
    "ppo-7b": ["--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--algo", "ppo", "--prompt-len", "1024",
               "--response-len", "2048"],
    "lora-7b-a100": ["--model", "qwen2.5-7b", "--gpus", "4", "--gpu-mem", "40", "--lora", "32", "--prompt-len",
                     "512", "--response-len", "512"],
}

runner = CliRunner()


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


def run_cli(directory: Path, args: list[str], output: Path | None = None):
    """Run one command in `directory`; check the promises every command makes for any input."""
    before = snapshot(directory)
    previous = os.getcwd()
    os.chdir(directory)
    try:
        result = runner.invoke(app, args)
    finally:
        os.chdir(previous)
    text = result.output
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, text[-2000:])
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert "Traceback" not in text and "internal error" not in text, (args, text[-2000:])
    if result.exit_code == 2:
        assert NAMES_A_FIELD.search(text), (args, text[-2000:])
    after = snapshot(directory)
    if output is not None:
        # The requested output and the folders -o asked to create for it.
        relative = output.relative_to(directory)
        for name in [str(relative), *(str(parent) for parent in relative.parents if str(parent) != ".")]:
            before.pop(name, None)
            after.pop(name, None)
    assert after == before, (args, set(after.items()) ^ set(before.items()))
    return result


@pytest.fixture(scope="module")
def seed_plans(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Plans solved by the CLI itself: the mutations start from what users actually hold."""
    directory = tmp_path_factory.mktemp("seeds")
    plans = {}
    for name, args in SEED_SOLVES.items():
        path = directory / f"{name}.toml"
        result = runner.invoke(app, ["solve", *args, "-o", str(path)])
        assert result.exit_code == 0, result.output
        plans[name] = tomllib.loads(path.read_text())
    return plans


def _leaves(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            found.extend(_leaves(value, (*prefix, key)))
        else:
            found.append((*prefix, key))
    return found


markup = st.sampled_from(["[/]", "[bold]x", "[/red]", "[link=x]y[/link]", "\\[", "[", "]"])
hostile_text = st.one_of(
    markup, st.text(max_size=40),
    st.builds(lambda n: "a" * n, st.sampled_from([1000, 200_000])),
    st.sampled_from(["", " ", "²", "nan", "inf", "-1", "1e308", "0x10", "true", "${HOME}", "\x00", "é" * 3]),
)
hostile_number = st.one_of(
    st.sampled_from([0, -1, 1, 3, 2**62, 2**63 - 1, -(2**63)]),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 2048.9, 7.5, 0.0, 1e-300]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
)
hostile_value = st.recursive(
    st.one_of(hostile_number, hostile_text, st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


def _deep(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"x": value}
    return value


@st.composite
def mutated_plan(draw, seeds: dict[str, dict[str, Any]]) -> str:
    data = copy.deepcopy(seeds[draw(st.sampled_from(sorted(seeds)))])
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_leaves(data)))
        node = data
        for part in path[:-1]:
            node = node[part]
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "section"]))
        if action == "replace":
            node[path[-1]] = draw(hostile_value)
        elif action == "delete":
            node.pop(path[-1], None)
        elif action == "add":
            node[draw(st.one_of(markup, st.text(min_size=1, max_size=10)))] = draw(hostile_value)
        else:
            data[path[0]] = draw(st.one_of(hostile_number, hostile_text))
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError):  # a value TOML cannot hold (NUL in a key): try a deep nesting instead
        text = ""
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        depth = draw(st.sampled_from([50, 5000]))
        text += "deep = " + "[" * depth + "]" * depth + "\n"
    return text


PLAN_COMMANDS = st.sampled_from(["validate", "explain", "render", "render-o", "solve-from", "validate-json"])


@FUZZ
@given(data=st.data())
def test_mutated_plans_exit_0_1_or_2_with_a_named_field_and_touch_no_other_file(data, seed_plans, tmp_path):
    (tmp_path / "plan.toml").write_text(data.draw(mutated_plan(seed_plans)), encoding="utf-8")
    command = data.draw(PLAN_COMMANDS)
    output = None
    if command == "render-o":
        output = tmp_path / "run.sh"
        args = ["render", "plan.toml", "-o", "run.sh"]
    elif command == "solve-from":
        args = ["solve", "--from", "plan.toml"]
    elif command == "validate-json":
        args = ["validate", "plan.toml", "--json"]
    else:
        args = [command, "plan.toml"]
    run_cli(tmp_path, args, output)


@st.composite
def hostile_config(draw) -> str:
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "top", "text_config", "deep", "raw"]))
    if kind == "top":
        return json.dumps(draw(st.one_of(st.lists(hostile_number, max_size=3), hostile_text, st.none())))
    if kind == "deep":
        depth = draw(st.sampled_from([100, 100_000]))
        return "[" * depth + "]" * depth
    if kind == "raw":
        return draw(st.sampled_from(["", "{", "{\"hidden_size\": 1" + "0" * 5000 + "}", "\ufeff{}", "NaN"]))
    config = dict(QWEN_CONFIG)
    if kind == "text_config":
        config = {"model_type": draw(hostile_value), "text_config": draw(st.one_of(hostile_value, st.just(config)))}
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key = draw(st.sampled_from([*QWEN_CONFIG, "head_dim", "num_experts", "num_experts_per_tok",
                                    "moe_intermediate_size", "kv_lora_rank", "first_k_dense_replace"]))
        if draw(st.booleans()):
            config[key] = draw(hostile_value)
        else:
            config.pop(key, None)
    return json.dumps(config)  # NaN and Infinity come out as the bare words Python's reader accepts


@FUZZ
@given(config=hostile_config(), with_output=st.booleans())
def test_hostile_config_json_exits_0_1_or_2_with_a_named_field(config, with_output, tmp_path):
    (tmp_path / "config.json").write_text(config, encoding="utf-8")
    args = ["solve", "--model", "config.json", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "512",
            "--response-len", "512"]
    output = tmp_path / "plan.toml" if with_output else None
    run_cli(tmp_path, [*args, "-o", "plan.toml"] if with_output else args, output)


SCRIPT_PIECES = st.sampled_from([
    "python3 -m verl.trainer.main_ppo", "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "data.train_batch_size=$TBS", "data.train_batch_size=${TBS:-${TBS:-8}}", "trainer.n_gpus_per_node=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.rollout.n=5", "\\\n", "'", '"', "$(",
    "<<EOF\nit's python3 -m verl.trainer.main_ppo data.train_batch_size=3\nEOF\n", "if [ x ]; then\nTBS=4\nelse\nTBS=2\nfi\n",
    "TBS=16\n", "data.max_prompt_length=nan", "data.max_response_length=1e308", "trainer.nnodes=0",
    "actor_rollout_ref.actor.optim.lr=inf", "${oc.env:SECRET}", "$SECRET", "actor_rollout_ref.acotr.ppo_epochs=2",
    "[/]", "[bold]x=1", "data.train_batch_size=8 data.train_batch_size=16", "#", ";", "&&", "\n", " ",
])


@FUZZ
@given(pieces=st.lists(st.one_of(SCRIPT_PIECES, hostile_text), max_size=14),
       nested=st.sampled_from([0, 0, 0, 3000]), with_output=st.booleans())
def test_hostile_launch_scripts_import_with_exit_0_or_2_and_a_named_field(pieces, nested, with_output, tmp_path):
    script = " ".join(pieces)
    if nested:
        script += " trainer.nnodes=" + "${A:-" * nested + "1" + "}" * nested
    (tmp_path / "run.sh").write_text(script, encoding="utf-8")
    args = ["import", "verl", "run.sh", "--gpu", "h100-80g"]
    output = tmp_path / "plan.toml" if with_output else None
    run_cli(tmp_path, [*args, "-o", "plan.toml"] if with_output else args, output)


FLAG_VALUES = st.one_of(hostile_text, st.sampled_from(["8", "0", "-1", "3", "1e308", "nan", "inf", "2048.9"]))
SOLVE_FLAGS = ["--gpus", "--gpu", "--gpu-mem", "--nodes", "--gpus-per-node", "--host-mem", "--algo", "--prompt-len",
               "--response-len", "--max-response-len", "--train-batch-size", "--n", "--ppo-mini-batch-size", "--lora",
               "--objective", "--fix", "--profile", "--from", "--model", "-o"]
FIX_KEYS = st.sampled_from(["actor", "cluster.gpus_per_node", "actor.param_offload", "rollout.tensor_model_parallel_size",
                            "model.lora.rank", "[/red]", "actor.ppo_epochs", "data", "cluster.gpu.memory_gib"])


# Output paths that stay inside the test's directory: hostile names, long names, the directory itself.
OUTPUT_NAMES = ["plan.toml", ".", "", "..", "[/].toml", "a" * 250 + ".toml", "p" * 260]


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(SOLVE_FLAGS), FLAG_VALUES, FIX_KEYS), max_size=3))
def test_hostile_solve_flags_exit_0_1_or_2_with_a_named_field(changes, tmp_path):
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh folder per example: outputs must not carry over
    flags = {"--model": "qwen2.5-0.5b", "--gpus": "8", "--gpu": "h100-80g", "--prompt-len": "512",
             "--response-len": "512"}
    fixes = []
    for flag, value, fix_key in changes:
        if flag == "--fix":
            fixes += ["--fix", f"{fix_key}={value}"]
        elif flag == "--gpu-mem":
            flags.pop("--gpu", None)
            flags[flag] = value
        else:
            flags[flag] = value
    output = None
    if "-o" in flags:
        flags["-o"] = OUTPUT_NAMES[len(flags["-o"]) % len(OUTPUT_NAMES)]
        if flags["-o"] not in ("", ".", ".."):
            output = tmp_path / flags["-o"]
    args = ["solve", *[part for pair in flags.items() for part in pair], *fixes]
    run_cli(tmp_path, args, output)


# --- round 3 (issue 28): charts, report / calibrate inputs, profiles, secrets --------------------------------

# Fewer examples than the plan fuzzers: a chart is seconds (the first loads vl-convert's Vega bundle), so these
# stay within a minute or two on 2 cores; RLPLAN_FUZZ_EXAMPLES raises them with the others.
CHART_FUZZ = settings(FUZZ, max_examples=max(4, EXAMPLES // 3))
INPUT_FUZZ = settings(FUZZ, max_examples=max(8, EXAMPLES * 2 // 3))
# Python allocations one command may make at its peak (tracemalloc): a hostile input is refused or streamed,
# never held whole (the 5.4 GB of a 100k-step report, /dev/zero's MemoryError).
MEMORY_LIMIT = 512 * 2**20

# Text that would run as script if a chart inlined it raw, or break out of a string, a comment or CDATA.
SCRIPT_TEXT = st.sampled_from([
    "</script><script>window.__pwned=1</script>", "</SCRIPT ><script>alert(1)//", "<!--<script>", "]]><script>",
    "<img src=x onerror=alert(1)>", "\u2028\u2029", "\"};alert(1);//", "' + alert(1) + '", "&lt;/script&gt;",
    "${alert(1)}", "{{7*7}}", "[/]", "<", ">", "&",
])
chart_text = st.one_of(SCRIPT_TEXT, st.builds(lambda a, b: a + b, SCRIPT_TEXT, st.text(max_size=12)))


def assert_only_the_charts_own_scripts(path: Path) -> None:
    """An HTML chart has two script elements, the inlined Vega bundle and the chart's own, whose spec is JSON;
    a planted `</script>` would end one early and open another."""
    if not path.is_file() or path.suffix != ".html":
        return
    inlined_spec(path.read_text(encoding="utf-8"))


def run_bounded(directory: Path, args: list[str], output: Path | None = None, env: dict[str, str] | None = None):
    """run_cli's promises, plus a bounded peak of Python allocations."""
    import tracemalloc

    tracemalloc.start()
    try:
        previous = os.environ.copy()
        os.environ.update(env or {})
        result = run_cli(directory, args, output)
    finally:
        os.environ.clear()
        os.environ.update(previous)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, (args, peak)
    return result


def hostile_chart_plan(seed: dict[str, Any], draw) -> dict[str, Any]:
    data = copy.deepcopy(seed)
    data["model"]["name"] = draw(chart_text)
    data["cluster"]["gpu"]["name"] = draw(chart_text)
    peaks = data["prediction"]["phase_peak_gib"]
    peaks[draw(chart_text)] = draw(st.sampled_from([1.0, 0.0, 1e30, -3.0]))
    return data


def runtime_record(step: int) -> dict[str, Any]:
    return {"step": step, "reward_mean": 0.1 * step, "kl_ref": 0.01, "entropy": 1.1, "response_length_mean": 200.0,
            "sync_logprob_gap": 0.002, "time/rollout": 1.5, "time/actor_update": 2.0, "time/step": 4.0,
            "memory/rollout_peak_gib": 3.0, "memory/actor_update_peak_gib": 4.0, "prompt_length_mean": 90.0,
            "sequences": 8.0, "memory_measure": "cuda_memory_held", "prompt_indices": [1, 2, 3]}


@CHART_FUZZ
@given(data=st.data())
def test_user_text_in_every_chart_string_stays_data_in_the_charts_own_script(data, seed_plans, tmp_path):
    """Invariant: explain --chart, solve --frontier and report with hostile text in the model, GPU, phase,
    metric and run names exit 0, 1 or 2 as every command does, and any HTML written holds no script element
    but the Vega bundle and the chart's own."""
    import tempfile

    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh folder per example
    plan = hostile_chart_plan(seed_plans[data.draw(st.sampled_from(sorted(seed_plans)))], data.draw)
    command = data.draw(st.sampled_from(["explain", "frontier", "report"]))
    suffix = data.draw(st.sampled_from([".html", ".html", ".svg"]))
    output = tmp_path / f"chart{suffix}"
    if command == "report":
        run = tmp_path / data.draw(st.sampled_from(["run", "<script>x()<", "r\u2028&<\x01"]))
        run.mkdir()
        (run / "plan.toml").write_text(tomli_w.dumps(plan), encoding="utf-8")
        records = [runtime_record(step) for step in (1, 2, 3)]
        for record in records:
            record["memory_measure"] = data.draw(chart_text)
            record[f"time/{data.draw(chart_text)}"] = 0.5
            record[f"memory/{data.draw(chart_text)}_peak_gib"] = 1.5
            if data.draw(st.booleans()):
                record.pop("memory/rollout_peak_gib")
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        args = ["report", run.name, "-o", output.name]
    else:
        (tmp_path / "plan.toml").write_text(tomli_w.dumps(plan), encoding="utf-8")
        args = (["explain", "plan.toml", "--chart", output.name] if command == "explain"
                else ["solve", "--from", "plan.toml", "--frontier", output.name, "--top", "3"])
    run_bounded(tmp_path, args, output)
    assert_only_the_charts_own_scripts(output)


HOSTILE_METRIC_KEYS = st.sampled_from(["step", "reward_mean", "kl_ref", "entropy", "time/rollout", "time/step",
                                       "memory/rollout_peak_gib", "memory/rollout_held_gib",
                                       "memory/actor_update_predicted_gib", "memory_measure", "sequences",
                                       "prompt_length_mean", "response_length_mean", "prompt_indices"])


@st.composite
def hostile_metrics(draw) -> bytes:
    """A metrics.jsonl as a run writes it, then damaged: hostile values and keys, a cut-off or binary line,
    integers past 2**64 or past Python's text limit, nesting too deep, a huge line, a million-step run."""
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "raw", "long"]))
    if kind == "raw":
        return draw(st.sampled_from([
            b"", b"\n\n", b"\xff\xfe\x00garbage\n", b"[1, 2]\n", b"null\n", b'"step"\n', b"{}\n",
            b'{"step": 1}\n{"step": 2, "rew', b'{"step": 1' + b"0" * 5000 + b"}\n", b"[" * 50_000 + b"]" * 50_000,
            b'{"step": 1, "reward_mean": 184467440737095516160000}\n', b'{"step": 18446744073709551616}\n',
            b'{"step": 1, "x": "' + b"a" * (3 * 2**20) + b'"}\n', b'{"step": 1, "reward_mean": NaN}\n',
        ]))
    if kind == "long":  # a long run: streamed and merged, never held whole
        return b"".join(json.dumps(runtime_record(step)).encode() + b"\n" for step in range(1, 20_001))
    records = [runtime_record(step) for step in range(1, draw(st.integers(min_value=1, max_value=5)) + 1)]
    for record in records:
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            key = draw(st.one_of(HOSTILE_METRIC_KEYS, st.text(max_size=10)))
            if draw(st.booleans()):
                record[key] = draw(st.one_of(hostile_value, st.none(), st.integers(min_value=2**63, max_value=2**80)))
            else:
                record.pop(key, None)
    text = "".join(json.dumps(record) + "\n" for record in records).encode()
    if draw(st.booleans()):
        text = text[:draw(st.integers(min_value=0, max_value=len(text)))]  # a run still writing
    return text


@INPUT_FUZZ
@given(content=hostile_metrics(), command=st.sampled_from(["report", "report", "calibrate"]),
       kind=st.sampled_from(["file", "file", "file", "file", "fifo", "dev-zero", "directory"]))
def test_hostile_metrics_files_exit_0_1_or_2_with_the_line_named_in_bounded_memory(content, command, kind,
                                                                                     seed_plans, tmp_path):
    """Invariant: report and calibrate --from-run on any metrics.jsonl (or a FIFO, /dev/zero, a directory in its
    place) exit 0, 1 or 2 without a traceback, name the field (a bad line by its number), finish within the
    deadline without blocking on a FIFO, and stay within MEMORY_LIMIT."""
    import tempfile

    if command == "report":
        pytest.importorskip("altair")
        pytest.importorskip("vl_convert")
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.toml").write_text(tomli_w.dumps(seed_plans["grpo-0.5b"]), encoding="utf-8")
    metrics = run / "metrics.jsonl"
    if kind == "file":
        metrics.write_bytes(content)
    elif kind == "fifo":
        os.mkfifo(metrics)
    elif kind == "dev-zero":
        metrics.symlink_to("/dev/zero")
    else:
        metrics.mkdir()
    if command == "report":
        output = tmp_path / "report.svg"
        result = run_bounded(tmp_path, ["report", "run", "-o", output.name, "--json"], output)
    else:
        output = tmp_path / "profile.toml"
        result = run_bounded(tmp_path, ["calibrate", "--from-run", "run/metrics.jsonl", "-o", output.name], output)
    if result.exit_code == 2 and kind == "file" and b"\n" in content.rstrip(b"\n"):
        assert "line" in result.output or "field" in result.output or "no finished step" in result.output


def _profile_keys() -> list[str]:
    import attrs

    from rlplan.planner.profile import Profile

    return [a.name for a in attrs.fields(Profile) if a.name != "name"]


@st.composite
def hostile_profile(draw) -> str:
    kind = draw(st.sampled_from(["values", "values", "values", "raw"]))
    if kind == "raw":
        return draw(st.sampled_from(["", "[profile]\n", "profile = 3\n", "x = [" * 3000 + "]" * 3000 + "\n",
                                     "training_mfu = 1" + "0" * 5000 + "\n", "[profile]\nprofile = {a = 1}\n",
                                     "\x00 = 1\n", "name = \"</script>\"\n"]))
    lines = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        key = draw(st.one_of(st.sampled_from(_profile_keys()), st.text(min_size=1, max_size=8)))
        literal = draw(st.sampled_from(["inf", "-inf", "nan", "1e308", "-1e308", "0", "-1", "1" + "0" * 400,
                                        "9223372036854775807", "1e-320", "true", "\"x\"", "[1]", "0.5", "16"]))
        lines.append(f"{json.dumps(key)} = {literal}")
    return "\n".join(lines) + "\n"


@INPUT_FUZZ
@given(profile=hostile_profile(), command=st.sampled_from(["solve", "validate", "explain"]))
def test_hostile_profiles_are_bounded_and_finite_or_bad_input_naming_the_key(profile, command, seed_plans,
                                                                              tmp_path):
    """Invariant: any profile TOML either loads with every value finite and inside its range (solve, validate
    and explain then run on it) or is bad input naming `profile` or `profile.<key>`; never exit 3."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    (tmp_path / "profile.toml").write_text(profile, encoding="utf-8")
    (tmp_path / "plan.toml").write_text(tomli_w.dumps(seed_plans["grpo-0.5b"]), encoding="utf-8")
    if command == "solve":
        args = ["solve", *SEED_SOLVES["grpo-0.5b"], "--profile", "profile.toml", "--json"]
    else:
        args = [command, "plan.toml", "--profile", "profile.toml", "--json"]
    result = run_bounded(tmp_path, args)
    if result.exit_code == 2 and '"field": "profile' not in result.output:
        # Not the profile's fault: the plan's own verdict (validate's INVALID table) or a rule.
        assert command == "validate" or '"field"' in result.output, result.output[-2000:]


SECRET = "pl4nted-S3cret-value"
SECRET_SCRIPT_PIECES = st.sampled_from([
    "trainer.wandb_key=$SECRET", "trainer.wandb_key=${SECRET}", "trainer.wandb_key=${SECRET:-}",
    "trainer.wandb_key=${SECRET:-default}", "trainer.wandb_key=\"$SECRET\"'x'", "'+trainer.token'=\"${SECRET}\"",
    "+trainer.url=https://u:${SECRET}@host/", "trainer.experiment_name=$SECRET", "trainer.project_name=${SECRET}",
    "data.train_files=$SECRET/train.parquet", "trainer.experiment_name='${oc.env:SECRET}'",
    "+x.y='${oc.env:SECRET}'", "data.train_batch_size=$NUMBER", "data.train_batch_size=$((NUMBER*2))",
    "trainer.wandb_key=$KEY", "trainer.wandb_key=${KEY:+set}", "trainer.n_gpus_per_node=8",
    "actor_rollout_ref.rollout.n=4", "\\\n", "'", '"',
    f"+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN={SECRET}", "+trainer.hf=$HF_TOKEN",
])
SECRET_ASSIGNMENTS = st.sampled_from(["", "KEY=$SECRET\n", "export KEY=\"${SECRET}\"\n", "KEY=${SECRET:-x}\n",
                                      "OTHER=$SECRET\nKEY=pre-$OTHER\n", "KEY='$SECRET'\n", "TBS=$NUMBER\n",
                                      # A credential the script sets itself (issue 41), then reads.
                                      f"export HF_TOKEN={SECRET}\nKEY=$HF_TOKEN\n",
                                      f"WANDB_API_KEY='{SECRET}'\nexport WANDB_API_KEY\nKEY=run-$WANDB_API_KEY\n"])


@INPUT_FUZZ
@given(assignments=SECRET_ASSIGNMENTS, pieces=st.lists(SECRET_SCRIPT_PIECES, min_size=1, max_size=6),
       render=st.booleans())
def test_no_environment_value_is_persisted_printed_or_rendered_by_import_verl(assignments, pieces, render,
                                                                               tmp_path):
    """Invariant: with a secret in the environment and no --env, import verl (and a render of what it wrote)
    exit 0, 1 or 2, and the secret's value appears in no file, no output and no error; a refusal names the
    variable."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    script = (assignments + "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
              + " ".join(pieces) + "\n")
    (tmp_path / "run.sh").write_text(script, encoding="utf-8")
    environment = {"SECRET": SECRET, "NUMBER": "987654"}
    output = tmp_path / "plan.toml"
    result = run_bounded(tmp_path, ["import", "verl", "run.sh", "--gpu", "h100-80g", "-o", "plan.toml"], output,
                         env=environment)
    texts = [result.output] + [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()
                               and p.name != "run.sh"]
    if render and output.is_file():
        rendered = run_bounded(tmp_path, ["render", "plan.toml"], env=environment)
        texts.append(rendered.output)
    for text in texts:
        assert SECRET not in text and "987654" not in text and "1975308" not in text, text[-2000:]
    if result.exit_code == 2 and ("SECRET" in script or "NUMBER" in script):
        assert NAMES_A_FIELD.search(result.output)


# --- round 4 (issue 41): verl logs for compare / calibrate, version flags, Megatron pins ----------------------

VERL_SCRIPT = Path(__file__).resolve().parents[2] / "data" / "verl_logs" / "grpo_qwen2.5-7b_long.sh"
VERL_LINE_VALUES = st.one_of(
    st.sampled_from(["30.5", "-30", "nan", "inf", "-inf", "1e308", "1e400", "9" * 400, "np.float64(20.7)",
                     "tensor(3.0, device='cuda:0')", "True", "[1, 2]", "", "0x10"]),
    hostile_text.filter(lambda text: "\n" not in text and "\r" not in text),
)
VERL_KEYS = st.sampled_from(["perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "timing_s/gen",
                             "timing/update_actor", "response_length/mean", "prompt_length/mean",
                             "response_length/max", "actor/pg_loss", "critic/score/mean", "x", ""])
VERL_STEPS = st.one_of(st.integers(min_value=-3, max_value=50), st.sampled_from(["9" * 400, "1e300", "2.5", "-1", ""]))


@st.composite
def hostile_verl_log(draw) -> str:
    """A verl console log or file-logger JSON lines, then damaged: hostile steps and values, negative memory and
    times, console and JSON lines mixed, Ray's prefixes and repeats, a cut-off last line."""
    lines = []
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        step = draw(VERL_STEPS)
        pairs = [(draw(VERL_KEYS), draw(VERL_LINE_VALUES)) for _ in range(draw(st.integers(0, 5)))]
        pairs += [("response_length/mean", "300"), ("prompt_length/mean", "100")] if draw(st.booleans()) else []
        if draw(st.booleans()):
            prefix = draw(st.sampled_from(["", "(TaskRunner pid=7) ", "\x1b[36m(main_task pid=1)\x1b[0m ", "bar\r"]))
            suffix = draw(st.sampled_from(["", " [repeated 7x across cluster]"]))
            lines.append(f"{prefix}step:{step} - " + " - ".join(f"{k}:{v}" for k, v in pairs) + suffix)
        else:
            data = {k: draw(st.one_of(hostile_number, st.just(v))) for k, v in pairs}
            raw_step: Any = draw(st.one_of(st.just(step), hostile_number))
            try:
                lines.append(json.dumps({"step": raw_step, "data": data}))
            except ValueError:  # an int past str()'s digit limit: json cannot write it either
                lines.append('{"step": 1, "data": {"x": ' + "9" * 5000 + "}}")
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        text = text[:draw(st.integers(min_value=0, max_value=len(text)))]  # a run still writing
    return text


@INPUT_FUZZ
@given(log=hostile_verl_log(), command=st.sampled_from(["compare", "compare-json", "calibrate"]))
def test_hostile_verl_logs_exit_0_1_or_2_with_notes_in_bounded_memory(log, command, tmp_path):
    """Invariant: compare (text or --json) and calibrate --from-verl-log on any verl log exit 0, 1 or 2 without a
    traceback, name the field when they refuse, touch no file but the profile, and stay within MEMORY_LIMIT; with
    --json, stdout is one JSON object."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    (tmp_path / "run.log").write_text(log, encoding="utf-8")
    (tmp_path / "run.sh").write_bytes(VERL_SCRIPT.read_bytes())
    if command == "calibrate":
        output = tmp_path / "profile.toml"
        run_bounded(tmp_path, ["calibrate", "--from-verl-log", "run.log", "--plan", "run.sh", "--gpu", "h100-80g",
                               "-o", output.name], output)
        return
    args = ["compare", "run.sh", "run.log", "--gpu", "h100-80g"] + (["--json"] if command == "compare-json" else [])
    result = run_bounded(tmp_path, args)
    if command == "compare-json":
        json.loads(result.stdout)


VERSION_FLAGS = ["--verl-version", "--vllm-version", "--sglang-version"]
VERSION_VALUES = st.one_of(
    st.sampled_from(["0.4.1", "v0.3.0.post1", "0.9.1", "0.24.0", "0.5.12", "1", "99.99.99", "0.0.0", "0.8.0.dev",
                     "0." + "9" * 5000, "9" * 5000 + ".1", "1e3", "-1.0", "", "nan", "0.4.1 ", "latest"]),
    hostile_text,
)


@FUZZ
@given(flags=st.lists(st.tuples(st.sampled_from(VERSION_FLAGS), VERSION_VALUES), max_size=3),
       command=st.sampled_from(["solve", "validate", "explain", "import"]))
def test_hostile_version_flags_exit_0_1_or_2_with_a_named_field(flags, command, seed_plans, tmp_path):
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    versions = [part for flag, value in flags for part in (flag, value)]
    if command == "solve":
        args = ["solve", *sum(([k, v] for k, v in zip(SEED_SOLVES["grpo-0.5b"][::2], SEED_SOLVES["grpo-0.5b"][1::2],
                                                     strict=True)), []), *versions]
    elif command == "import":
        (tmp_path / "run.sh").write_bytes(VERL_SCRIPT.read_bytes())
        args = ["import", "verl", "run.sh", "--gpu", "h100-80g", *versions]
    else:
        (tmp_path / "plan.toml").write_text(tomli_w.dumps(seed_plans["grpo-0.5b"]), encoding="utf-8")
        args = [command, "plan.toml", *versions]
    run_cli(tmp_path, args)


MEGATRON_PINS = st.sampled_from(["actor.megatron.tensor_model_parallel_size", "actor.megatron.pipeline_model_parallel_size",
                                 "actor.megatron.context_parallel_size", "actor.megatron.expert_model_parallel_size",
                                 "actor.megatron.virtual_pipeline_model_parallel_size",
                                 "actor.megatron.expert_tensor_parallel_size", "rollout.tensor_model_parallel_size"])
MEGATRON_VALUES = st.sampled_from(["0", "1", "2", "3", "5", "16", "1000", "-1", "nan", "9" * 5000, "x"])


@FUZZ
@given(pins=st.lists(st.tuples(MEGATRON_PINS, MEGATRON_VALUES), min_size=1, max_size=2),
       model=st.sampled_from(["qwen2.5-7b", "qwen3-30b-a3b"]), strategy=st.sampled_from(["megatron", "auto"]))
def test_hostile_megatron_pins_exit_0_1_or_2_with_a_named_field(pins, model, strategy, tmp_path):
    """Invariant: a pinned parallel degree that does not divide the cluster, the heads, the layers or the experts
    is refused naming the --fix key (it divided by zero), never an internal error."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    fixes = [part for key, value in pins for part in ("--fix", f"{key}={value}")]
    run_cli(tmp_path, ["solve", "--model", model, "--gpus", "16", "--gpu", "h100-80g", "--strategy", strategy,
                       "--prompt-len", "1024", "--response-len", "1024", *fixes])
