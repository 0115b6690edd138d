"""Recipes for the derived-model registry test (`models.register_model`): a "build" that copies the base folder and
counts its calls, a fingerprint, and a build that fails."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

BUILDS: list[str] = []
VERSION = {"value": 1}


def copy_build(base_dir: Path, out_dir: Path) -> dict[str, Any]:
    shutil.copytree(base_dir, out_dir)
    BUILDS.append(str(out_dir))
    return {"copied_from": str(base_dir)}


def fingerprint(base_dir: Path) -> dict[str, Any]:
    return {"base": base_dir.name, "version": VERSION["value"]}


def failing_build(base_dir: Path, out_dir: Path) -> dict[str, Any]:
    raise RuntimeError("the recipe broke")
