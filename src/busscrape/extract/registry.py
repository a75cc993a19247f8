"""The extractors of a folder (``extractors/*.toml`` and ``*.py``, plus the installed
``busscrape.extractors`` entry points: ``extract.python``), loaded and checked at start.

Every process that needs extractors (the worker, ``busscrape extractors``, the dispatcher's name
check, export) loads the whole folder once: an invalid file stops the process at start with the
file, the field and the reason (``ExtractorInvalid``, exit code 2), instead of failing task after
task later. A process sees the extractors shipped with busscrape (``bundled_dir``: found wherever
it runs, as the streams are) and those of ``BUSSCRAPE_EXTRACT__DIR`` (default ``extractors`` in the
working directory; not there: none of its own), which override a bundled one of the same name
(``Registry.with_bundled``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from busscrape.errors import ConfigurationError
from busscrape.extract.definition import NAME, Extractor


class ExtractorInvalid(ConfigurationError):
    """An extractor file that does not load: exit at start, naming the file, the field and why."""

    reason = "extractor_invalid"


class UnknownExtractor(ConfigurationError):
    reason = "unknown_extractor"


def describe(exc: ValidationError, limit: int = 5) -> str:
    """``fields.price.type: not one of 'str', 'int' … (got 'money')`` for the first few errors, in
    a few words rather than pydantic's."""
    from busscrape.settings.problems import reason

    errors = exc.errors()
    places = [tuple(str(p) for p in err["loc"] if not str(p).startswith("function-after")) for err in errors]
    parts = []
    for err, where in zip(errors, places, strict=True):
        if err["type"] == "too_short" and any(len(o) > len(where) and o[:len(where)] == where for o in places):
            continue  # a list whose item failed is "too short" too (the item is not counted): said by the item
        message = "unknown key" if err["type"] == "extra_forbidden" else reason(err)
        if err["type"] in ("literal_error", "int_parsing", "greater_than_equal") \
                and "input" in err and not isinstance(err["input"], dict):
            message += f" (got {err['input']!r})"
        parts.append(f"{'.'.join(where) or '(file)'}: {message}")
    if len(parts) > limit:
        parts[limit:] = [f"… and {len(parts) - limit} more"]
    return "; ".join(parts)


def bundled_dir() -> Path:
    """The extractors shipped with busscrape (the demo's): in the wheel, or at the repository root."""
    from importlib import resources

    packaged = resources.files("busscrape") / "_extractors"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "extractors"


def load_file(path: Path) -> Extractor:
    """One extractor file, validated (raises ``ExtractorInvalid``)."""
    name = path.name.removesuffix(".toml")
    if not NAME.match(name):
        raise ExtractorInvalid(f"{path}: {name!r} is not an extractor name (lower-case letters, digits, '.', '_', "
                               "'-'); rename the file")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExtractorInvalid(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ExtractorInvalid(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExtractorInvalid(f"{path}: not TOML: {exc}") from None
    given = doc.pop("name", name)
    if given != name:
        raise ExtractorInvalid(f"{path}: name: {given!r} is not the file's name {name!r}; an extractor is named "
                               "by its file")
    try:
        return Extractor.model_validate({"name": name, **doc})
    except ValidationError as exc:
        raise ExtractorInvalid(f"{path}: {describe(exc)}") from None


@dataclass(frozen=True)
class Registry(Mapping[str, Extractor]):
    """Extractors by name, from one folder."""

    folder: Path | None
    extractors: dict[str, Extractor] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: Path | str | None) -> Registry:
        """Every ``*.toml`` of ``folder`` (none when it is None or not there); the first invalid
        file raises ``ExtractorInvalid``."""
        if folder is None:
            return cls(None)
        folder = Path(folder)
        if not folder.is_dir():
            if folder.exists():
                raise ExtractorInvalid(f"{folder}: the extractors folder is not a folder")
            from busscrape.extract import python

            return cls(folder, dict(python.from_entry_points()))
        from busscrape.extract import python

        extractors: dict[str, Extractor] = dict(python.from_entry_points())  # a file of the same name wins
        files: dict[str, Any] = {}
        for path in sorted([*folder.glob("*.toml"), *folder.glob("*.py")]):
            if path.suffix == ".py" and not NAME.match(path.stem):
                continue  # a helper module beside the extractors (_common.py)
            if path.stem in files:
                raise ExtractorInvalid(f"{path}: {files[path.stem]} has the same name; keep one")
            extractor = python.from_file(path) if path.suffix == ".py" else load_file(path)
            extractors[extractor.name] = extractor
            files[extractor.name] = path
        return cls(folder, extractors, files)

    @classmethod
    def with_bundled(cls, folder: Path | str | None) -> Registry:
        """What a process sees, as it sees the streams: the extractors shipped with busscrape
        (always found, wherever the process runs), then ``folder``'s (``BUSSCRAPE_EXTRACT__DIR``,
        default ``extractors`` in the working directory), a file there overriding a bundled one
        of the same name."""
        bundled = cls.load(bundled_dir())
        own = cls.load(folder)
        if own.folder is not None and own.folder.resolve() == bundled_dir().resolve():
            return own
        return cls(own.folder, {**bundled.extractors, **own.extractors}, {**bundled.files, **own.files})

    def __getitem__(self, name: str) -> Extractor:
        return self.extractors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.extractors)

    def __len__(self) -> int:
        return len(self.extractors)

    def where(self) -> str:
        """The folders the extractors come from, as a user reads them."""
        folders = list(dict.fromkeys(str(path.parent) for path in self.files.values()))
        if self.folder is not None and str(self.folder) not in folders:
            folders.append(f"{self.folder} (not there)" if not self.folder.is_dir() else str(self.folder))
        return ", ".join(folders) or "(no folder)"

    def get_or_explain(self, name: str) -> Extractor:
        """The extractor, or ``UnknownExtractor`` saying which ones there are and where."""
        found = self.extractors.get(name)
        if found is None:
            known = ", ".join(sorted(self.extractors)) or "none"
            raise UnknownExtractor(f"no extractor {name!r} in {self.where()} (there: {known}); "
                                   "add extractors/<name>.toml or set BUSSCRAPE_EXTRACT__DIR")
        return found
