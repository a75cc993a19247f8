"""ops/state_dir.py: the state dir a run needs, writable, or a fix-it message."""

from __future__ import annotations

import pytest

from busscrape.errors import ConfigurationError
from busscrape.ops.state_dir import require_writable
from busscrape.settings import Settings


def test_a_missing_state_dir_is_made(tmp_path):
    folder = tmp_path / "a" / "state"
    require_writable(Settings(state_dir=folder))
    assert folder.is_dir()


def test_a_state_dir_that_cannot_be_written_says_how_to_fix_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigurationError) as raised:
        require_writable(Settings(state_dir=blocker / "state"))
    message = str(raised.value)
    assert str(blocker / "state") in message and "BUSSCRAPE_STATE_DIR" in message
    assert "--user" in message and "chown" in message
