"""The real ``busscrape`` entry point as a child process, as a new user runs it (off a terminal).

Forked from a warm interpreter (tests/support/zygote.py) where that starts the same as a fresh
``python -m busscrape``: the same entry point and exit codes, ~0.5 s less CPU per command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.zygote import ZYGOTE


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any BUSSCRAPE_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    env.update(extra)
    return env


def busscrape(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              stdin: str | bytes | None = None, timeout: float = 120,
              text: bool = True) -> subprocess.CompletedProcess[Any]:
    """``python -m busscrape ARGS`` to the end: exit code, stdout and stderr (files, not a terminal);
    str, or bytes with ``text=False``."""
    env = clean_env() if env is None else env
    if ZYGOTE.can_run(env):
        return ZYGOTE.run(list(args), env, cwd, stdin, timeout, text=text)
    return subprocess.run([sys.executable, "-m", "busscrape", *args], env=env,
                          cwd=cwd, input=stdin, capture_output=True, text=text, timeout=timeout)
