"""Extractor files: a valid one loads, an invalid one is refused at start with the file, the field and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from busscrape.extract.registry import ExtractorInvalid, Registry

REPO = Path(__file__).resolve().parents[2]


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_the_demo_extractor_loads():
    registry = Registry.load(REPO / "extractors")
    demo = registry["demo-product"]
    assert demo.version == 1 and demo.required_fields() == ["name", "price"]
    assert demo.syntaxes() == {"jsonld"}
    assert [alt.kind for alt in demo.fields["reviews"].sources()] == ["css", "jsonld"]


@pytest.mark.parametrize(("text", "where", "why"), [
    ('version = 1\n[fields.price]\ncss = ".p"\ntype = "money"\n', "fields.price.type", "got 'money'"),
    ('version = 1\n[fields.price]\ncss = "p[[["\n', "fields.price", "is not a selector"),
    ('version = 1\n[fields.price]\nxpath = "//p[("\n', "fields.price", "is not an expression"),
    ('version = 1\n[fields.price]\ncss = ".p"\nregex = "(a"\n', "fields.price", "does not compile"),
    ('version = 1\n[fields.price]\ncss = ".p"\njsonld = "Product.price"\n', "fields.price", "exactly one of"),
    ('version = 1\n[fields.price]\njsonld = "Product.price"\nattr = "x"\n', "fields.price", "css and xpath"),
    ('version = 1\n[fields.price]\ncss = ".p"\nrequird = true\n', "fields.price.requird", "unknown key"),
    ('[fields.price]\ncss = ".p"\n', "version", "required"),
    ('version = 0\n[fields.price]\ncss = ".p"\n', "version", "must be at least 1 (got 0)"),
    ('version = 1\n[fields.r]\ncss = ".r"\nfields.a = { jsonld = "a" }\n', "fields.r", "sub-field 'a'"),
    ('version = 1\n[fields.r]\nany = [{ css = ".r", required = true }]\n', "fields.r", "any[0]: required"),
    ('version = 1\nfields = {}\n', "fields", "must have at least 1 item"),
    ('version = 1\n[fields.p]\nany = [{ css = "p[[[" }]\n', "fields.p.any.0", "css 'p[[[' is not a selector"),
    ('version = 1\n[fields.p]\nany = []\n', "fields.p.any", "must have at least 1 item(s)"),
    ('version = 1\n[fields."bad name"]\ncss = "p"\n', "fields", "field name 'bad name'"),
    ('version = 1\n[fields.price\n', "", "not TOML"),
    ('name = "other"\nversion = 1\n[fields.a]\ncss = "p"\n', "name", "is not the file's name"),
])
def test_an_invalid_file_is_refused_naming_the_file_and_the_field(tmp_path, text, where, why):
    path = write(tmp_path / "extractors", "shop", text)
    with pytest.raises(ExtractorInvalid) as caught:
        Registry.load(tmp_path / "extractors")
    message = caught.value.message
    assert message.startswith(f"{path}: {where}") and why in message, message
    for pydantic_wording in ("Input should", "Value error", "Tuple should have", "Field required", "Extra inputs"):
        assert pydantic_wording not in message, message


def test_a_file_name_that_is_no_extractor_name_is_refused(tmp_path):
    write(tmp_path, "Shop Products", 'version = 1\n[fields.a]\ncss = "p"\n')
    with pytest.raises(ExtractorInvalid, match="rename the file"):
        Registry.load(tmp_path)


def test_no_folder_is_an_empty_registry_and_an_unknown_name_says_what_there_is(tmp_path):
    assert len(Registry.load(tmp_path / "none")) == 0
    write(tmp_path, "a", 'version = 1\n[fields.a]\ncss = "p"\n')
    with pytest.raises(Exception, match=r"no extractor 'b' in .* \(there: a\)"):
        Registry.load(tmp_path).get_or_explain("b")


def test_a_worker_refuses_to_start_with_a_malformed_extractor(tmp_path, nats_url):
    """The worker (and every command) loads the folder at start: exit 2, the field named."""
    import subprocess
    import sys

    write(tmp_path / "ex", "shop", 'version = 1\n[fields.price]\ncss = ".p"\ntype = "money"\n')
    env = {"BUSSCRAPE_EXTRACT__DIR": str(tmp_path / "ex"), "BUSSCRAPE_NATS__URL": nats_url, "PATH": "/usr/bin:/bin",
           "BUSSCRAPE_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "busscrape", "worker", "--max-tasks", "1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "shop.toml: fields.price.type" in " ".join(done.stderr.split()), done.stderr
