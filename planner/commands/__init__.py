"""The commands layer: the one door between a user and the planner, and between the planner and the runtime.

Only the modules here (and runtime/commands.py, runtime/measure.py's command) read files, print and pick exit
codes: `cli.py` the typer entry, `entry.py` the console script in front of it, `commands_io.py` their plumbing,
and each command's work beside them. Everything else in planner/ is pure (tests/planner/test_layering.py).
"""
