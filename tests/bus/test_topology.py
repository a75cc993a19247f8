from pathlib import Path

import pytest

from busscrape.bus import names, topology
from busscrape.errors import ConfigurationError
from busscrape.settings import Settings


def test_bundled_definitions_cover_everything_busscrape_needs():
    defs = topology.load(Settings())
    assert {(d.kind, d.name) for d in defs} >= names.REQUIRED
    kinds = [d.kind for d in defs]
    # buckets before the streams that source them, streams before consumers
    assert kinds == sorted(kinds, key=lambda k: {"kv": 0, "object_store": 1, "stream": 2, "consumer": 3}[k])


def test_placeholders_take_the_settings():
    s = Settings(streams={"results_max_age": "3d", "worker_ack_wait": "20s", "worker_max_deliver": 3,
                          "worker_max_deferrals": 50, "results_max_bytes": "1GiB"})
    defs = {(d.kind, d.name): d for d in topology.load(s)}
    results = defs[("stream", names.RESULTS_STREAM)]
    assert results.fields["max_age"] == 3 * 86400
    assert results.fields["max_bytes"] == 2**30
    workers = defs[("consumer", names.WORKERS_CONSUMER)]
    assert workers.fields["ack_wait"] == 20
    assert workers.fields["max_deliver"] == 3 + 50  # attempts plus deferrals (streams/workers.toml)
    assert "backoff" not in workers.fields  # see streams/workers.toml for why
    assert workers.stream == names.TASKS_STREAM
    seen = defs[("kv", names.SEEN_BUCKET)]
    assert seen.stream == names.SEEN_STREAM
    assert seen.managed["max_age"] == s.streams.recrawl_window == seen.config.max_age
    assert seen.create.ttl == s.streams.recrawl_window


def test_tasks_source_the_seen_bucket_into_task_partitions():
    tasks = next(d for d in topology.load(Settings()) if d.name == names.TASKS_STREAM)
    config = tasks.config
    assert config.sources[0].name == names.SEEN_STREAM
    transform = config.sources[0].subject_transforms[0]
    assert (transform.src, transform.dest) == names.SEEN_TO_TASKS
    assert config.subjects == [names.TASK_SUBJECTS]


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('kind = "queue"\nname = "X"', "'kind' must be one of"),
        ('kind = "stream"\nname = "X"\nretentoin = "limits"', "unknown field(s) retentoin"),
        ('kind = "consumer"\ndurable_name = "d"', "'stream' is required"),
        ('kind = "stream"\nname = "X"\nmax_age = "{streams.nope}"', "names no setting"),
        ('kind = "stream"\nname = "X"\nmax_age = "soon"', "max_age: not a duration"),
        ('kind = "stream"\nname = [', "cannot read stream definition"),
    ],
)
def test_bad_definition_files_say_which_file_and_why(tmp_path, text, says):
    folder = write(tmp_path / "defs", "bad.toml", text)
    with pytest.raises(ConfigurationError) as info:
        topology.load(Settings(), folder)
    assert "bad.toml" in str(info.value)
    assert says in str(info.value)


def test_a_folder_missing_required_definitions_is_refused(tmp_path):
    folder = write(tmp_path / "defs", "only.toml", 'kind = "stream"\nname = "ONLY"\nsubjects = ["x"]')
    with pytest.raises(ConfigurationError, match="lacks definitions busscrape needs"):
        topology.load(Settings(), folder)
