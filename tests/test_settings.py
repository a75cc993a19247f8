from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from busscrape.settings import Settings
from busscrape.settings.reference import meaning, reference_markdown


def test_env_nested_with_double_underscore(monkeypatch):
    monkeypatch.setenv("BUSSCRAPE_NATS__URL", "nats://127.0.0.5:4222")
    monkeypatch.setenv("BUSSCRAPE_WORKER__CONCURRENCY", "7")
    monkeypatch.setenv("BUSSCRAPE_STREAMS__RESULTS_MAX_AGE", "2d")
    monkeypatch.setenv("BUSSCRAPE_NETWORK__ALLOW", '["127.0.0.2/32", "localhost:8080"]')
    s = Settings()
    assert s.nats.url == "nats://127.0.0.5:4222"
    assert s.worker.concurrency == 7
    assert s.streams.results_max_age == 2 * 86400
    assert s.network.allow == ["127.0.0.2/32", "localhost:8080"]


def test_flags_override_env_and_keep_the_rest(monkeypatch):
    monkeypatch.setenv("BUSSCRAPE_WORKER__CONCURRENCY", "7")
    monkeypatch.setenv("BUSSCRAPE_NATS__PASSWORD", "s3cret")
    s = Settings().with_overrides(worker={"concurrency": 3, "max_tasks": None}, streams={"worker_ack_wait": "30s"})
    assert s.worker.concurrency == 3
    assert s.streams.worker_ack_wait == 30
    assert s.nats.password is not None and s.nats.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.model_dump(mode="json"))


def test_invalid_value_names_the_field(monkeypatch):
    monkeypatch.setenv("BUSSCRAPE_WORKER__CONCURRENCY", "zero")
    with pytest.raises(ValidationError) as info:
        Settings()
    assert "concurrency" in str(info.value)


def test_every_setting_is_documented():
    undocumented = []
    for name, field in Settings.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            undocumented += [f"{name}.{sub}" for sub in section.model_fields if not meaning(section, sub)]
        elif not meaning(Settings, name):
            undocumented.append(name)
    assert undocumented == []


def test_a_settings_meaning_is_the_docstring_under_it_and_a_sections_include_its_bases():
    class Base(BaseModel):
        inherited: int = 1
        """From the base,
        on two lines."""

    class Section(Base):
        plain: str = "x"
        """What plain means."""
        bare: int = 2

        def method(self) -> None:
            """A method's docstring: not a field's."""

    assert meaning(Section, "plain") == "What plain means."
    assert meaning(Section, "inherited") == "From the base, on two lines."
    assert meaning(Section, "bare") == ""
    assert meaning(Section, "method") == ""


def test_the_docs_list_every_setting_as_busscrape_config_prints_it():
    # The configuration page holds a marker that scripts/docs_hooks.py replaces at build time with
    # reference_markdown(), the table `busscrape config --markdown` prints (tests/test_docs.py
    # checks the expansion and the built page).
    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert "<!-- generated: settings -->" in page
    table = reference_markdown()
    assert table.startswith("| variable | default | meaning |") and "`BUSSCRAPE_WORKER__ISOLATION`" in table


def test_the_default_worker_and_ingester_names_are_the_process_that_reads_the_settings():
    """A process forked after the settings were imported (the test zygote, an extraction pool)
    must not name itself after its parent: the default name carries the process id."""
    import os
    import socket

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its names and ends at once
        settings = Settings()
        os.write(write, f"{settings.worker.name} {settings.ingester.name}".encode())
        os._exit(0)
    os.close(write)
    names = os.read(read, 1024).decode().split()
    os.waitpid(pid, 0)
    os.close(read)
    assert names == [f"{socket.gethostname()}-{pid}"] * 2
