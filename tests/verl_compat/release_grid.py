"""Plans for the verl the user runs: solve a grid of requests for each verl release, render them, check them.

For each release (default: every release planner/stack.py's VERL_ENGINE_PINS names), each request of the grid is
solved as `rlplan solve --verl-version <release>` would, rendered as `rlplan render --target verl --format
overrides`, and checked:

- rendered  render writes it (no PlanError);
- keys      every key it writes is in that release's trainer config (presets/verl_inventory.json);
- composes  (with --verl-git / --verl-wheels and hydra-core installed) Hydra composes that release's own
            `ppo_trainer` / `ppo_megatron_trainer` from its config folder with the rendered overrides, as
            `@hydra.main` does at start-up.

The grid (issue 45): Qwen2.5-7B, Qwen2.5-0.5B, Llama-3.1-8B; 8 x 80 GB (H100), 2 x 24 GB (RTX 4090), 16 x 141 GB
(H200, 2 nodes); GRPO n = 8 and PPO; 512 + 1024 and 2048 + 8192 prompt + response tokens: 36 requests.

Usage: python tests/verl_compat/release_grid.py [--releases 0.4.1,0.9.1] [--verl-git DIR] [--verl-wheels DIR] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rlplan.planner import verl_inventory  # noqa: E402
from rlplan.planner.commands.solve_commands import SolveFlags, solve_inputs  # noqa: E402
from rlplan.planner.errors import PlanError  # noqa: E402
from rlplan.planner.plan import Plan  # noqa: E402
from rlplan.planner.render import render_plan  # noqa: E402
from rlplan.planner.solver import solve_engines  # noqa: E402
from rlplan.planner.stack import VERL_ENGINE_PINS  # noqa: E402
from rlplan.planner.verl_keys import backend_of  # noqa: E402

MODELS = ("qwen2.5-7b", "qwen2.5-0.5b", "llama-3.1-8b")
CLUSTERS = (("h100-80g", 8), ("rtx4090-24g", 2), ("h200-141g", 16))
ALGORITHMS = (("grpo", 8), ("ppo", None))
LENGTHS = ((512, 1024), (2048, 8192))


@attrs.frozen
class Request:
    model: str
    gpu: str
    gpus: int
    algo: str
    n: int | None
    prompt_len: int
    response_len: int

    @property
    def name(self) -> str:
        return (f"{self.model} {self.gpus}x{self.gpu} {self.algo}{f' n={self.n}' if self.n else ''} "
                f"{self.prompt_len}+{self.response_len}")


GRID = tuple(Request(model, gpu, gpus, algo, n, prompt, response)
             for model, (gpu, gpus), (algo, n), (prompt, response)
             in itertools.product(MODELS, CLUSTERS, ALGORITHMS, LENGTHS))


def solved(request: Request, release: str) -> Plan | None:
    """What `rlplan solve --verl-version <release>` writes for the request (None: infeasible)."""
    flags = SolveFlags(model=request.model, gpu=request.gpu, gpus=request.gpus, algo=request.algo, n=request.n,
                       prompt_len=request.prompt_len, response_len=request.response_len, verl_version=release,
                       quiet=True)
    inputs = solve_inputs(flags, None, lambda *_: None)
    return solve_engines(inputs.request, inputs.engines, keep=1).plan


def override_lines(overrides: str) -> list[str]:
    """The overrides of a `--format overrides` file (its comment lines left out)."""
    return [line for line in overrides.splitlines() if line.strip() and not line.startswith("#")]


def rendered_keys(overrides: str) -> list[str]:
    return [line.split("=", 1)[0].lstrip("+~") for line in override_lines(overrides)]


@attrs.frozen
class Outcome:
    request: str
    solved: bool
    rendered: bool = False
    missing_keys: tuple[str, ...] = ()
    composes: bool | None = None
    why: str = ""


def check(request: Request, release: str, composer: Any) -> Outcome:
    plan = solved(request, release)
    if plan is None:
        return Outcome(request.name, solved=False)
    try:
        overrides = render_plan(plan, "verl", "overrides")
    except PlanError as error:
        return Outcome(request.name, solved=True, why=f"{error.field}: {error.message}")
    backend = backend_of(plan.actor.strategy)
    known = verl_inventory.keys_of(release, backend)
    missing = tuple(key for key in rendered_keys(overrides) if key not in known)
    composes, why = None, ""
    if composer is not None:
        composes, why = composer(release, backend, override_lines(overrides))
    return Outcome(request.name, solved=True, rendered=True, missing_keys=missing, composes=composes, why=why)


def hydra_composer(git: Path | None, wheels: Path | None) -> Any:
    """(release, backend, overrides) -> (composes, why), with hydra over that release's own config folder."""
    from tests.verl_compat.make_inventory import ReleaseSource, composed

    def compose(release: str, backend: str, overrides: list[str]) -> tuple[bool, str]:
        try:
            composed(ReleaseSource(release, git, wheels), verl_inventory.TRAINER_CONFIGS[backend],  # type: ignore[index]
                     overrides)
        except Exception as error:  # hydra's refusal: the release's config does not take the overrides
            return False, f"{type(error).__name__}: {str(error).splitlines()[0]}"
        return True, ""

    return compose


def table(results: dict[str, list[Outcome]]) -> str:
    composed = any(outcome.composes is not None for outcomes in results.values() for outcome in outcomes)
    lines = ["| `--verl-version` | solved | rendered | keys in that release's config | "
             + ("composed by that release's hydra config | " if composed else "") + "rendered / solved |",
             "|---|---|---|---|" + ("---|" if composed else "") + "---|"]
    for release, outcomes in results.items():
        solved_count = sum(o.solved for o in outcomes)
        rendered = sum(o.rendered for o in outcomes)
        keys_ok = sum(o.rendered and not o.missing_keys for o in outcomes)
        accepted = sum(bool(o.composes) for o in outcomes)
        final = accepted if composed else keys_ok
        share = f"{100 * final / solved_count:.0f} %" if solved_count else "-"
        lines.append(f"| {release} | {solved_count} | {rendered} | {keys_ok} | "
                     + (f"{accepted} | " if composed else "") + f"{share} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(VERL_ENGINE_PINS))
    parser.add_argument("--verl-git", type=Path, help="a verl git directory with the release tags (compose check)")
    parser.add_argument("--verl-wheels", type=Path, help="verl wheels for releases the git directory lacks")
    parser.add_argument("--json", action="store_true", help="every outcome as JSON")
    args = parser.parse_args()
    composer = hydra_composer(args.verl_git, args.verl_wheels) if args.verl_git or args.verl_wheels else None
    results: dict[str, list[Outcome]] = {}
    for release in args.releases.split(","):
        results[release] = [check(request, release, composer) for request in GRID]
        failures = [o for o in results[release] if o.solved and not (o.rendered and not o.missing_keys
                                                                      and o.composes is not False)]
        for outcome in failures:
            print(f"verl {release}: {outcome.request}: {outcome.why or 'keys ' + ', '.join(outcome.missing_keys)}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps({release: [attrs.asdict(o) for o in outcomes] for release, outcomes in results.items()},
                         indent=1))
    else:
        print(table(results))
    solved_all = sum(o.solved for outcomes in results.values() for o in outcomes)
    good = sum(o.rendered and not o.missing_keys and o.composes is not False
               for outcomes in results.values() for o in outcomes)
    return 0 if good == solved_all else 1


if __name__ == "__main__":
    sys.exit(main())
