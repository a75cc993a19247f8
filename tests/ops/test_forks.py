"""The fork server the command line's daemons are forked from (``ops.forks``).

The daemons themselves are tested where ``busscrape run`` starts them: tests/e2e/test_run.py (a
killed run takes its forks and the fork server with it; each in its own session),
tests/cli/test_newuser.py (a forked worker's configuration error reaches the run's message),
``busscrape demo`` (a forked worker runs the extractors' process pool), tests/client (the Python
API leaves no fork server behind: its daemons are fresh interpreters).
"""

from __future__ import annotations

import subprocess
import sys

from busscrape.ops.forks import PRELOAD


def test_what_the_fork_server_imports_starts_no_thread():
    # A thread started on import would be copied into every fork stopped where it stood (a lock
    # held for ever): the server must stay single-threaded.
    code = ("import os, sys\n"
            f"for name in {list(PRELOAD)!r}: __import__(name)\n"
            "print(len(os.listdir('/proc/self/task')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_a_log_the_fork_cannot_open_is_the_callers_error_not_a_traceback_on_the_terminal(tmp_path):
    # The fork server writes to the run's terminal: a failure inside the fork, before its output
    # is its log, would land there. The log is opened by the caller, as subprocess does.
    code = ("import os, sys\n"
            "from busscrape.ops import forks\n"
            "forks.prestart()\n"
            "r, w = os.pipe()\n"
            "try:\n"
            "    forks.start(['worker'], dict(os.environ), sys.argv[1], r)\n"
            "except IsADirectoryError as exc:\n"
            "    print('refused', exc.filename)\n")
    log = tmp_path / "worker-1.log"
    log.mkdir()
    done = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["refused", str(log)], done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
