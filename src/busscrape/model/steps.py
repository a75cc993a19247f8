"""The step DSL a task may carry: what to do in the page between navigation and capture.

A step list is a JSON array of objects told apart by ``action``::

    [{"action": "click", "selector": "#more"},
     {"action": "scroll", "mode": "infinite", "max_scrolls": 10},
     {"action": "wait_stable", "quiet": "500ms"},
     {"action": "screenshot", "name": "after-scroll"}]

Validation happens where a task is built (dispatcher) and again where it runs (worker), so an
invalid list is a permanent error with the reason, never a crash. The worker's renderer
executes them (``busscrape.render``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from busscrape.net.addresses import CREDENTIALS_INSTEAD, has_credentials
from busscrape.units import Duration

LoadState = Literal["load", "domcontentloaded", "networkidle"]
WaitUntil = Literal["load", "domcontentloaded", "networkidle", "commit"]


class _Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Goto(_Step):
    """Navigate the page to another URL (checked by the same network policy)."""

    action: Literal["goto"] = "goto"
    url: str = Field(min_length=1, max_length=8192)
    wait_until: WaitUntil = "load"
    timeout: Duration | None = None

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, url: str) -> str:
        if has_credentials(url):
            raise ValueError(f"a goto URL with a user name or password would be stored with the task; "
                             f"{CREDENTIALS_INSTEAD}")
        return url


class WaitFor(_Step):
    """Wait for a selector to reach a state, or for the page to reach a load state."""

    action: Literal["wait_for"] = "wait_for"
    selector: str | None = Field(None, min_length=1, max_length=2048)
    selector_state: Literal["attached", "detached", "visible", "hidden"] = "visible"
    state: LoadState | None = None
    timeout: Duration | None = None

    @model_validator(mode="after")
    def _one_target(self) -> WaitFor:
        if (self.selector is None) == (self.state is None):
            raise ValueError("wait_for needs exactly one of 'selector' or 'state'")
        return self


class Click(_Step):
    action: Literal["click"] = "click"
    selector: str = Field(min_length=1, max_length=2048)
    button: Literal["left", "right", "middle"] = "left"
    timeout: Duration | None = None


class Fill(_Step):
    action: Literal["fill"] = "fill"
    selector: str = Field(min_length=1, max_length=2048)
    value: str = Field(max_length=65536)
    timeout: Duration | None = None


class Press(_Step):
    """Press a key (``Enter``, ``Control+A``) on a selector, or on the page when none is given."""

    action: Literal["press"] = "press"
    key: str = Field(min_length=1, max_length=64)
    selector: str | None = Field(None, min_length=1, max_length=2048)
    timeout: Duration | None = None


class Scroll(_Step):
    """Scroll to the bottom once, or keep scrolling while the page grows (infinite scroll).

    ``max_scrolls`` caps the infinite mode so a feed that never ends still finishes.
    """

    action: Literal["scroll"] = "scroll"
    mode: Literal["bottom", "infinite"] = "bottom"
    max_scrolls: int = Field(20, ge=1, le=500)
    delay: Duration = Field(0.5, le=10)


class WaitStable(_Step):
    """Wait until the DOM stops changing for ``quiet`` (single-page apps), at most ``timeout``."""

    action: Literal["wait_stable"] = "wait_stable"
    quiet: Duration = Field(0.5, gt=0, le=30)
    timeout: Duration = Field(10.0, gt=0, le=300)


class Sleep(_Step):
    action: Literal["sleep"] = "sleep"
    duration: Duration = Field(le=60)


class Screenshot(_Step):
    """An extra, named screenshot taken at this point (archived beside the main one)."""

    action: Literal["screenshot"] = "screenshot"
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    full_page: bool = False


class Evaluate(_Step):
    """Run JavaScript in the page. Refused unless the worker sets ``allow_evaluate``."""

    action: Literal["evaluate"] = "evaluate"
    script: str = Field(min_length=1, max_length=65536)


Step = Annotated[
    Goto | WaitFor | Click | Fill | Press | Scroll | WaitStable | Sleep | Screenshot | Evaluate,
    Field(discriminator="action"),
]
"""One step; ``action`` picks the kind."""


def _unique_screenshot_names(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    # Each screenshot step is archived as shot-<name>: two of one name would be one file.
    names = [step.name for step in steps if isinstance(step, Screenshot)]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"screenshot step names must be unique (archived as shot-<name>): {', '.join(twice)} "
                         "appears more than once")
    return steps


Steps = Annotated[tuple[Step, ...], AfterValidator(_unique_screenshot_names)]
"""A task's step list: wherever one is read (task, JSONL line, ``--steps``)."""


def describe_errors(exc: ValidationError, limit: int = 5) -> str:
    """What is wrong with a step list, in a few words: the step, its field and what is accepted
    (``step 2: action 'wait' is not one of 'goto', 'click' …``; ``step 1 selector: required``)."""
    return "; ".join(_problem(error) for error in exc.errors()[:limit])


def _problem(error: Any) -> str:
    from busscrape.settings.problems import reason

    loc, ctx = error["loc"], error.get("ctx") or {}
    if error["type"] == "union_tag_not_found":
        why = f'no action; write "action": one of {_actions()}'
    elif error["type"] == "union_tag_invalid":
        why = f"action {ctx.get('tag')!r} is not one of {_actions()}"
    elif error["type"] == "json_invalid":
        why = f"not valid JSON ({ctx.get('error')}); write a JSON list of steps or @FILE"
    elif error["type"] == "extra_forbidden":
        why = "not a field of this action"
    elif error["type"] in ("list_type", "tuple_type"):
        why = 'not a list; write a list of steps ([{"action": "click", "selector": "#more"}])'
    else:
        why = reason(error)
    if not loc or not isinstance(loc[0], int):
        return why
    field = ".".join(str(part) for part in loc[2:])  # (number, action, field …)
    return f"step {loc[0] + 1}{f' {field}' if field else ''}: {why}"


def _actions() -> str:
    kinds = get_args(get_args(Step)[0])  # Step is Annotated[Goto | WaitFor | …, Field(discriminator=…)]
    return ", ".join(repr(get_args(kind.model_fields["action"].annotation)[0]) for kind in kinds)
