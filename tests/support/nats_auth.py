"""NATS credentials for tests: nkeys, NATS JWTs (v2), ``.creds`` files and server configurations.

Keys are made with ``nkeys`` (nats-io's own Python package, which nats-py signs with). The JWTs
follow nats-io/jwt v2 as nats-server decodes them: header ``{"typ":"JWT","alg":"ed25519-nkey"}``,
claims ``jti`` (base32 of SHA-512/256 over the claims without ``jti``), ``iat``, ``iss``, ``name``,
``sub`` and a ``nats`` object carrying ``type`` and ``version: 2``, signed with Ed25519 over
``header.payload`` (unpadded base64url). Only what decentralised auth needs is minted: an operator,
an account with JetStream enabled, and a user that account signed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_UNLIMITED = -1


@dataclass(frozen=True)
class NKey:
    """An nkey pair: ``public`` (``U…``, ``A…``, ``O…``) and its ``seed`` (``SU…``, ``SA…``, ``SO…``)."""

    public: str
    seed: str

    def sign(self, data: bytes) -> bytes:
        pair = nkeys.from_seed(bytearray(self.seed.encode()))
        try:
            return pair.sign(data)
        finally:
            pair.wipe()


def new_nkey(kind: str) -> NKey:
    """A fresh key pair; ``kind`` is ``user``, ``account`` or ``operator``."""
    prefix = {"user": nkeys.PREFIX_BYTE_USER, "account": nkeys.PREFIX_BYTE_ACCOUNT,
              "operator": nkeys.PREFIX_BYTE_OPERATOR}[kind]
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    pair = nkeys.from_seed(bytearray(seed))
    try:
        return NKey(public=pair.public_key.decode(), seed=seed.decode())
    finally:
        pair.wipe()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def encode_jwt(*, subject: str, name: str, issuer: NKey, nats: dict[str, object]) -> str:
    """A NATS v2 JWT of ``nats`` claims about ``subject``, signed by ``issuer``."""
    claims: dict[str, object] = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject}
    # jti: the hash of the standard claims with jti empty (nats-io/jwt ClaimsData.hash).
    digest = hashlib.new("sha512_256", _compact(claims)).digest()
    claims = {"jti": base64.b32encode(digest).rstrip(b"=").decode(), **claims,
              "nats": {**nats, "version": 2}}
    signing_input = f"{_b64(_compact(_HEADER))}.{_b64(_compact(claims))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


@dataclass(frozen=True)
class Decentralised:
    """An operator, its system account, one account (JetStream enabled) and one user of it."""

    operator: NKey
    system: NKey
    account: NKey
    user: NKey
    operator_jwt: str
    system_jwt: str
    account_jwt: str
    user_jwt: str

    def server_config(self, folder: Path) -> str:
        """Config lines for operator mode with an in-memory resolver preloaded with the account.

        The JWTs go into files of their own (``operator:`` takes a path; the preload is an include),
        so the main file holds no token text that could be mistaken for anything else.
        """
        (folder / "operator.jwt").write_text(self.operator_jwt)
        (folder / "accounts.conf").write_text(
            f"resolver_preload: {{\n  {self.system.public}: \"{self.system_jwt}\"\n"
            f"  {self.account.public}: \"{self.account_jwt}\"\n}}\n")
        return f'operator: "{folder / "operator.jwt"}"\nresolver: MEMORY\ninclude "accounts.conf"\n'

    def creds(self, path: Path) -> Path:
        """The user's ``.creds`` file (JWT + seed, the layout ``nsc`` writes), mode 600."""
        return write_creds(path, self.user_jwt, self.user.seed)


def decentralised(name: str = "busscrape") -> Decentralised:
    """Mint an operator, its system account (JetStream needs one), an account it signed
    (JetStream unlimited) and a user the account signed."""
    operator, system, account, user = new_nkey("operator"), new_nkey("account"), new_nkey("account"), new_nkey("user")
    operator_jwt = encode_jwt(subject=operator.public, name=f"{name}-operator", issuer=operator,
                              nats={"type": "operator", "system_account": system.public})
    system_jwt = encode_jwt(subject=system.public, name="SYS", issuer=operator,
                            nats={"type": "account", "limits": {"subs": _UNLIMITED, "data": _UNLIMITED,
                                                                "payload": _UNLIMITED, "conn": _UNLIMITED}})
    limits = {"subs": _UNLIMITED, "data": _UNLIMITED, "payload": _UNLIMITED, "imports": _UNLIMITED,
              "exports": _UNLIMITED, "wildcards": True, "conn": _UNLIMITED, "leaf": _UNLIMITED,
              "mem_storage": _UNLIMITED, "disk_storage": _UNLIMITED, "streams": _UNLIMITED,
              "consumer": _UNLIMITED}
    account_jwt = encode_jwt(subject=account.public, name=f"{name}-account", issuer=operator,
                             nats={"type": "account", "limits": limits, "default_permissions": {"pub": {}, "sub": {}}})
    user_jwt = user_jwt_for(user, account, name=f"{name}-user")
    return Decentralised(operator, system, account, user, operator_jwt, system_jwt, account_jwt, user_jwt)


def user_jwt_for(user: NKey, account: NKey, *, name: str = "user") -> str:
    """A user JWT for ``user``, signed by ``account`` (no limits, default permissions)."""
    return encode_jwt(subject=user.public, name=name, issuer=account,
                      nats={"type": "user", "pub": {}, "sub": {}, "subs": _UNLIMITED, "data": _UNLIMITED,
                            "payload": _UNLIMITED})


def write_creds(path: Path, user_jwt: str, seed: str) -> Path:
    """A ``.creds`` file in the layout ``nsc`` writes (nats-py reads the line after each BEGIN)."""
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )
    path.chmod(0o600)
    return path


def write_seed(path: Path, key: NKey) -> Path:
    """An nkey seed file (what ``BUSSCRAPE_NATS__NKEY_SEED_FILE`` points at), mode 600."""
    path.write_text(key.seed + "\n")
    path.chmod(0o600)
    return path
