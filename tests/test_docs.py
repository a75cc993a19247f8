"""The documentation: the README's links land, the generated references say what the code says.

`make test` builds the site with `mkdocs build --strict` before pytest (every link and anchor
between pages checked by mkdocs); these tests cover what that build does not: the README, which is
outside the site, and the generated pages' content.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import typer.main
from markdown.extensions.toc import slugify

from busscrape.cli import app
from busscrape.cli.reference import cli_reference_markdown
from busscrape.settings.reference import reference, reference_markdown

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def anchors(page: Path) -> set[str]:
    """The ids mkdocs gives the headings of a page (Python-Markdown's toc slugs)."""
    text = FENCE.sub("", page.read_text())
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in HEADING.findall(text)}


def test_every_relative_link_of_the_readme_lands_on_a_file_and_an_anchor_it_has():
    readme = ROOT / "README.md"
    text = FENCE.sub("", readme.read_text())
    broken = []
    links = [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]
    for link in links:
        path, _, anchor = link.partition("#")
        target = (readme.parent / path) if path else readme
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in anchors(target):
            broken.append(f"{link}: {target.name} has no heading #{anchor}")
    assert len(links) > 20 and broken == []


def test_the_readme_stays_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400


def test_the_configuration_page_is_the_settings_reference_generated_at_build_time():
    page = (ROOT / "docs" / "configuration.md").read_text()
    built = hooks().expand(page)
    assert reference_markdown() in built and "<!-- generated" not in built
    assert all(f"`{variable}`" in built for variable, _, _ in reference())
    assert "`BUSSCRAPE_WORKER__ISOLATION`" in built


def test_the_cli_page_is_the_cli_reference_generated_at_build_time():
    built = hooks().expand((ROOT / "docs" / "cli.md").read_text())
    assert cli_reference_markdown() in built and "<!-- generated" not in built


def test_a_marker_that_names_no_generator_fails_the_build():
    from mkdocs.exceptions import PluginError

    with pytest.raises(PluginError, match="unknown generated section 'setings'"):
        hooks().expand("<!-- generated: setings -->", "configuration.md")


def test_the_cli_reference_has_every_command_and_every_visible_option():
    text = cli_reference_markdown()
    missing = []

    def section(path):
        # A hidden option is looked for in its own command's section only: another command may
        # show an option of the same name (`crawl` hides `--format`, `dispatch` and `export` show it).
        start = text.index(f" `{path}`\n")
        end = text.find("\n#", start)
        return text[start:] if end == -1 else text[start:end]

    def walk(command, path):
        if f"`{path}`" not in text:
            missing.append(path)
        for param in command.params:
            names = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
            shown = [name for name in names if f"{name}" in text]
            if getattr(param, "hidden", False):
                own = section(path)
                assert not any(f"`{name} " in own or f"`{name}`" in own for name in names), (path, names)
            elif param.param_type_name == "option" and len(shown) != len(names):
                missing.append(f"{path} {names}")
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "busscrape")
    assert missing == []
    for command in ("busscrape run", "busscrape crawl", "busscrape dlq replay", "busscrape streams apply"):
        assert f"## `{command}`" in text
    assert "--lifeline" not in text and "--wait-streams" not in text  # internal, hidden from --help too


@pytest.mark.slow
def test_the_site_builds_strictly_with_both_references_in_it(tmp_path):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path), strict=True))
    configuration = (tmp_path / "configuration" / "index.html").read_text()
    cli = (tmp_path / "cli" / "index.html").read_text()
    assert all(f"<code>{variable}</code>" in configuration for variable, _, _ in reference())
    assert "<code>busscrape dlq replay</code>" in cli and "<code>--max-pages" in cli
