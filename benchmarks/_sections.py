"""Replace one `## ` section of a generated markdown page (docs/accuracy.md) in place.

Shared by the benchmarks that each own one section of that page (steptime_sweeps.py: section 5,
public_verl_runs.py: section 4), so a section is found and cut the same way everywhere.
"""

from __future__ import annotations

from pathlib import Path


def replace_section(text: str, heading: str, body: str) -> str:
    """`text` with the section that starts at `heading` (up to the next "\\n## ") replaced by `body`, which
    starts with the heading itself; appended when the heading is absent. Later sections are kept."""
    start = text.find(heading)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n"
    end = text.find("\n## ", start + len(heading))
    tail = "" if end < 0 else text[end:]
    return text[:start] + body.rstrip("\n") + "\n" + tail


def print_or_write_section(section: str, heading: str, write: Path | None) -> int:
    """A benchmark's section printed, or written into `write` in place of its old one; the exit code."""
    if write is None:
        print(section)
        return 0
    text = write.read_text(encoding="utf-8") if write.exists() else ""
    write.write_text(replace_section(text, heading, section), encoding="utf-8")
    print(f"wrote {write}")
    return 0
