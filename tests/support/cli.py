"""The real ``busscrape`` entry point as a child process, as a new user runs it (off a terminal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any BUSSCRAPE_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update(extra)
    return env


def busscrape(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdin: str | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m busscrape ARGS`` to the end: exit code, stdout and stderr (pipes, not a terminal)."""
    return subprocess.run([sys.executable, "-m", "busscrape", *args], env=clean_env() if env is None else env,
                          cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout)
