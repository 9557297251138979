"""The package's TOML data (presets/*.toml), parsed, with a JSON copy of each parse kept beside Python's
byte-compiled files.

tomllib is pure Python: parsing models.toml, gpus.toml and the accuracy tables took a whole `rlplan solve`
process longer than importing attrs does (benchmarks/solve_time.py); json's parser is C and reads the same data
in about a millisecond. The copy is named by a hash of the TOML text, so an edited file is parsed afresh, and is
written as Python writes its byte-compiled files: into the data folder's __pycache__, never under
PYTHONDONTWRITEBYTECODE / -B, and silently not where the folder is read-only or the data is no plain file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tomllib
import zlib
from pathlib import Path
from typing import Any

PACKAGE = "rlplan.presets"


def package_toml(filename: str) -> dict[str, Any]:
    """presets/<filename> parsed, as tomllib parses it."""
    resource = package_file(PACKAGE, filename)
    text = resource.read_text(encoding="utf-8")
    cache = _cache_path(resource, filename, text)
    if cache is not None:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(cache.read_text(encoding="utf-8"))
    data = tomllib.loads(text)
    if cache is not None and not sys.dont_write_bytecode:
        _write_copy(cache, data)
    return data


def package_toml_exists(filename: str) -> bool:
    return package_file(PACKAGE, filename).is_file()


def package_file(package: str, filename: str) -> Any:
    """<package>/<filename> (package: rlplan.presets, rlplan.templates): a path beside the package's __init__
    where the package is a folder (every wheel and editable install), else what importlib.resources serves (a zip
    import). importlib.resources is imported only then: it brings tempfile and zipfile, a few milliseconds of
    every process's start."""
    import importlib

    init = getattr(importlib.import_module(package), "__file__", None)
    if init and Path(init).is_file():
        return Path(init).parent / filename
    from importlib import resources

    return resources.files(package).joinpath(filename)


def _cache_path(resource: Any, filename: str, text: str) -> Path | None:
    if not isinstance(resource, Path):
        return None
    # CRC-32 and length, not hashlib: importing hashlib (OpenSSL) cost more than the hash is worth here.
    data = text.encode("utf-8")
    digest = f"{zlib.crc32(data):08x}{len(data):x}"
    return resource.parent / "__pycache__" / f"{filename}.{digest}.json"


def _write_copy(cache: Path, data: dict[str, Any]) -> None:
    """The parse as JSON, only where JSON gives back exactly that data (no dates, no NaN); older copies of the same
    file removed; a folder that cannot be written is no error."""
    try:
        dumped = json.dumps(data, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return
    if json.loads(dumped) != data:
        return
    filename = cache.name.rsplit(".", 2)[0]
    with contextlib.suppress(OSError):
        cache.parent.mkdir(exist_ok=True)
        for old in cache.parent.glob(f"{filename}.*.json"):
            if old != cache:
                old.unlink(missing_ok=True)
        partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        partial.write_text(dumped, encoding="utf-8")
        os.replace(partial, cache)
