"""The `rlplan` console script, in front of cli.py: what happens before the command's modules are loaded.

cli.py imports typer, rich and the planner at module level; a Ctrl-C during that second would otherwise
end in Python's KeyboardInterrupt traceback before `guarded` (which handles Ctrl-C inside a command) exists.
Here only the standard library is loaded when the import starts.
"""

from __future__ import annotations

import sys

# As a shell reports SIGINT (128 + 2): commands_io.ExitCode.INTERRUPTED, not imported so this stays light.
INTERRUPTED = 130


def main() -> None:
    try:
        from rlplan.planner.commands.cli import main as run_command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(INTERRUPTED)
    run_command()
