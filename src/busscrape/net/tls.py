"""TLS client contexts from the settings' files, and the words for a TLS failure.

Shared by the NATS connection (``bus.py``) and the S3 storage (``storage_s3.py``): a CA file
that holds no certificate is a ``ConfigurationError`` naming its variable, and a failed handshake
is reported by its short reason (``unable to get local issuer certificate``, ``Hostname
mismatch…``, ``tlsv13 alert certificate required``) rather than OpenSSL's whole line.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from busscrape.errors import ConfigurationError


def client_context(ca_file: Path | None, variable: str) -> ssl.SSLContext:
    """A verifying client context that trusts ``ca_file``, or the system's CAs when it is None."""
    if ca_file is not None and not ca_file.is_file():
        raise ConfigurationError(f"{variable}: {ca_file} is not a readable file")
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except ssl.SSLError as exc:
        raise ConfigurationError(f"{variable}: {ca_file} holds no usable PEM certificate ({reason(exc)})") from None


def reason(exc: BaseException) -> str:
    """The short reason of a TLS failure."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return exc.verify_message
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__
