"""How the clients trust an https:// server: the ``verify=`` option, loaded once, and how a
failed certificate check is recognised behind an HTTPX error (``_base`` translates it)."""

from __future__ import annotations

import os
import ssl

from consumer_sdk.errors import CertificateError

#: How a client checks an https:// server's certificate: ``True`` (the default) against HTTPX's
#: trusted CAs (the ``certifi`` bundle); a path to a PEM CA bundle, for a private CA; a ready
#: ``ssl.SSLContext`` (e.g. with a client certificate); ``False`` not at all (tests only).
Verify = bool | str | os.PathLike[str] | ssl.SSLContext


def tls_verify(url: str, verify: Verify) -> bool | ssl.SSLContext:
    """What to hand HTTPX as ``verify`` for ``url``; a CA bundle is loaded here, once.

    Raises ``ValueError`` when the CA file cannot be read or holds no PEM certificate, so a
    wrong path fails when the client is built rather than on every call.
    """
    if isinstance(verify, bool | ssl.SSLContext):
        # A plain-HTTP client never makes a TLS connection (paths are relative to the base URL
        # and redirects are not followed), so skip building the default SSL context: it costs
        # ~10 ms per client.
        return False if url.startswith("http://") else verify
    path = os.fspath(verify)
    try:
        return ssl.create_default_context(cafile=path)
    except OSError as exc:  # ssl.SSLError is an OSError too
        reason = exc.strerror or str(exc)
        raise ValueError(f"cannot load CA file {path!r}: {reason}") from exc


def certificate_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error behind an HTTPX error, if that is what it was."""
    seen: BaseException | None = exc
    for _ in range(8):  # HTTPX -> httpcore -> ssl: a short chain; bounded against cycles
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def certificate_error(where: str, failure: ssl.SSLCertVerificationError) -> CertificateError:
    """The one message for a server certificate that failed verification, either transport."""
    return CertificateError(
        f"{where}: the server's TLS certificate failed verification "
        f"({failure.verify_message or failure.reason}); for a private CA pass its "
        "bundle as verify=/ca_file (CLI: --ca-file or CPROXY_CA_FILE)"
    )
