"""Sessions: cookies and storage (Playwright ``storage_state``) kept across one session's tasks.

A task that names ``options.session`` renders in a fresh browser context loaded with that
session's stored state (the SESSIONS bucket, key = session name), isolated from other sessions
and from session-less tasks (whose reused tabs are wiped and never see a session's cookies).
How a session logs in comes from the sessions file (``worker.sessions_file``)::

    [[session]]
    name = "shop-*"                    # the session names it covers (a glob), first match wins
    login_url = "https://shop.example/login"
    login_steps = [{action = "fill", selector = "#user", value = "alice"},
                   {action = "fill", selector = "#password", value = "…"},
                   {action = "click", selector = "button[type=submit]"}]
    check_selector = "#logout"         # on a task's page when logged in (optional)
    check_url = "/login"               # a task's final URL containing this means: logged out (optional)
    ttl = "1h"                         # after this the session logs in again

``login_steps`` run once when the session is new (or expired), and again when a task's page fails
the check; then the task's page is loaded again. After each task the context's state is stored
back, so cookies a page set carry on (unless another worker has stored a newer login meanwhile).
Within one worker a session's tasks run one at a time (one login, not one per slot); across
workers the first to find a session missing takes its login lease (HOSTS, ``login.<name>``) and
logs in, and the others' tasks of that session are deferred until it is stored (then they use it).
A failed check logs in again under the same lease: one login again for the fleet, however many
workers' pages failed the check at once.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nats.js.errors
import orjson
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import TypeAdapter, ValidationError

from busscrape.bus import names, payloads
from busscrape.bus.retry import TRANSIENT
from busscrape.bus.scan import kv_latest
from busscrape.errors import ConfigurationError, InvalidTask, StorageUnavailable
from busscrape.model.steps import Steps, describe_errors
from busscrape.units import parse_duration
from busscrape.worker.fleet_gate import host_token
from busscrape.worker.leases import Lease, take

_STEPS = TypeAdapter(Steps)
log = structlog.get_logger("busscrape.worker")


@dataclass(frozen=True)
class SessionRule:
    name: str
    login_url: str
    login_steps: tuple[Any, ...]
    check_selector: str | None = None
    check_url: str | None = None
    ttl: float = 3600.0


def read_rules(path: Path | None) -> tuple[SessionRule, ...]:
    if path is None:
        return ()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot read the sessions file: {exc}") from None
    rules = []
    for number, raw in enumerate(data.get("session", []), 1):
        where = f"{path}: [[session]] #{number}"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(
                raw.get("login_url"), str):
            raise ConfigurationError(f"{where}: 'name' and 'login_url' are required strings")
        unknown = set(raw) - {"name", "login_url", "login_steps", "check_selector", "check_url", "ttl"}
        if unknown:
            raise ConfigurationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            steps = _STEPS.validate_python(raw.get("login_steps", []))
        except ValidationError as exc:
            raise ConfigurationError(f"{where} ({raw['name']}): login_steps: {describe_errors(exc)}") from None
        try:
            ttl = parse_duration(raw.get("ttl", "1h"))
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"{where} ({raw['name']}): ttl: {exc}") from None
        rules.append(SessionRule(raw["name"], raw["login_url"], tuple(steps), raw.get("check_selector"),
                                 raw.get("check_url"), ttl))
    return tuple(rules)


@dataclass
class Stored:
    name: str
    state: dict[str, Any]
    logged_in_at: float
    expires_at: float
    proxy: str | None = None
    logins: int = 1

    def encode(self) -> bytes:
        return orjson.dumps({"state": self.state, "logged_in_at": self.logged_in_at, "expires_at": self.expires_at,
                             "proxy": self.proxy, "logins": self.logins})

    @classmethod
    def decode(cls, name: str, value: bytes | None) -> Stored | None:
        try:
            raw = orjson.loads(value or b"")
            return cls(name, raw["state"], float(raw["logged_in_at"]), float(raw["expires_at"]), raw.get("proxy"),
                       int(raw.get("logins", 1)))
        except (ValueError, TypeError, KeyError):
            return None

    def summary(self) -> dict[str, Any]:
        """What ``busscrape sessions`` shows: never a cookie's value."""
        return {"session": self.name, "logged_in_at": self.logged_in_at, "expires_at": self.expires_at,
                "expired": self.expires_at <= time.time(), "proxy": self.proxy, "logins": self.logins,
                "cookies": sorted({f"{c.get('name')}@{c.get('domain')}" for c in self.state.get("cookies", [])}),
                "origins": sorted(o.get("origin", "") for o in self.state.get("origins", []))}


class SessionStore:
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._kv: KeyValue | None = None
        self._room: int | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(names.SESSIONS_BUCKET)
        return self._kv

    async def get(self, name: str, *, expired: bool = False) -> Stored | None:
        try:
            entry = await (await self._bucket()).get(name)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        stored = Stored.decode(name, entry.value)
        if stored is None or (not expired and stored.expires_at <= time.time()):
            return None
        return stored

    async def put(self, stored: Stored, *, same_login: bool = False) -> str | None:
        """Store the session; what was left out to fit a SESSIONS value: None (nothing),
        ``local_storage`` (its origins' storage: the cookies, which hold a login, are kept) or
        ``everything`` (not stored: its cookies alone are over the limit). A page's storage is
        the page's to fill: over the limit it is never a retry, nor the page's failure.

        ``same_login``: a task's cookies written back after its page, stored only while the
        session still holds the login the task used (compare-and-set on the key's revision).
        Another worker may have logged in again meanwhile; the older login's cookies over it
        would send the next task in logged out, to fail its check and log in once more."""
        try:
            bucket = await self._bucket()
            if self._room is None:
                self._room = await payloads.kv_room(self._js, bucket)
            left_out, value = None, stored.encode()
            if len(value) > self._room:
                left_out = "local_storage"
                value = replace(stored, state={**stored.state, "origins": []}).encode()
            if len(value) > self._room:
                return "everything"
            if not same_login:
                await bucket.put(stored.name, value)
            else:
                await self._put_over_same_login(bucket, stored, value)
            return left_out
        except TRANSIENT as exc:
            raise StorageUnavailable(f"cannot store session {stored.name}: {exc!r}",
                                     what=names.SESSIONS_BUCKET) from None

    @staticmethod
    async def _put_over_same_login(bucket: KeyValue, stored: Stored, value: bytes) -> None:
        while True:  # each turn ends, or another write landed in between: read it again
            try:
                entry = await bucket.get(stored.name)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return  # dropped (``busscrape sessions drop``) while the task ran: stays dropped
            current = Stored.decode(stored.name, entry.value)
            if current is None or current.logged_in_at != stored.logged_in_at:
                log.info("session.newer_login_kept", session=stored.name)
                return
            try:
                await bucket.update(stored.name, value, last=entry.revision)
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                continue

    async def drop(self, name: str) -> bool:
        if await self.get(name, expired=True) is None:
            return False
        await (await self._bucket()).purge(name)
        return True

    async def names(self) -> list[str]:
        return sorted(await kv_latest(self._js, names.SESSIONS_BUCKET))


class Sessions:
    """The worker's side: rules, the store, one lock per session in this worker and one login
    lease per session in the fleet."""

    def __init__(self, js: JetStreamContext, rules: tuple[SessionRule, ...], *, holder: str = "worker",
                 login_wait: float = 0.5) -> None:
        self.rules = rules
        self.store = SessionStore(js)
        self._js = js
        self._hosts: KeyValue | None = None
        self._ttl = 15.0
        self.holder = holder.encode()
        self.login_wait = login_wait
        """How long a task waits (deferred) while another worker logs its session in."""
        self._locks: dict[str, asyncio.Lock] = {}
        self.logins = 0

    async def claim_login(self, name: str) -> Lease | None:
        """The fleet's one login of session ``name``: a lease on ``login.<name>`` in HOSTS (it
        expires with its holder), or None while another worker holds it."""
        try:
            if self._hosts is None:
                self._hosts = await self._js.key_value(names.HOSTS_BUCKET)
                self._ttl = (await self._hosts.status()).ttl or self._ttl
            key = f"login.{host_token(name)}"
            taken = await take(self._hosts, key, self.holder)
        except TRANSIENT as exc:
            raise StorageUnavailable(f"cannot take the login lease of session {name}: {exc!r}",
                                     what=names.SESSIONS_BUCKET) from None
        return None if taken is None else Lease(self._hosts, key, *taken, self._ttl)

    def rule(self, name: str) -> SessionRule:
        for rule in self.rules:
            if fnmatch.fnmatchcase(name, rule.name):
                return rule
        raise InvalidTask(f"no session rule in the worker's sessions file covers session {name!r}",
                          reason="unknown_session")

    def lock(self, name: str) -> asyncio.Lock:
        if len(self._locks) > 10_000:
            for key in [k for k, lock in self._locks.items() if not lock.locked()]:
                del self._locks[key]
        return self._locks.setdefault(name, asyncio.Lock())
