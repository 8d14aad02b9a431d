"""What every client of one appliance shares: its address, the CA it is
pinned to, the bearer token, and the rule for trying a call again."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pyqwest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel

from . import errors

DEFAULT_URL = "https://127.0.0.1:8443"

# Calls that are safe to send again when the answer was lost: reads, and
# the adapter calls the fencing token and call ids make repeatable (a
# repeat answers what the first did, or is refused as stale). A call not
# named here is sent again only when it surely never left this process
# (the connection was refused or never made). BeginCall, CallModel and
# RequestDecision are not here: a repeat would issue a second call, bill a
# second model turn or open a second question; nor ClaimAttempt (a second
# attempt claimed) or ReportOutcome (an invalid output counted twice
# against maxCorrections).
_REPEATABLE = frozenset(
    {
        "agentbay.adapter.v1.Adapter/StartAttempt",
        "agentbay.adapter.v1.Adapter/Heartbeat",
        "agentbay.adapter.v1.Adapter/CompleteCall",
        "agentbay.adapter.v1.Adapter/AwaitCall",
        "agentbay.adapter.v1.Adapter/Checkpoint",
        "agentbay.adapter.v1.Adapter/AwaitDecision",
        "agentbay.runs.v1.Runs/GetRun",
        "agentbay.runs.v1.Runs/ListRuns",
        "agentbay.runs.v1.Runs/CancelRun",
        "agentbay.runtime.v1.Runtime/Interrupt",
        "agentbay.capacity.v1.Capacity/RenewLease",
        "agentbay.capacity.v1.Capacity/ReleaseLease",
    }
)


def repeatable(service: str, method: str, level: IdempotencyLevel) -> bool:
    """Whether a call may be sent again after its answer was lost."""
    if level in (IdempotencyLevel.NO_SIDE_EFFECTS, IdempotencyLevel.IDEMPOTENT):
        return True
    return f"{service}/{method}" in _REPEATABLE


def never_sent(e: BaseException) -> bool:
    """Whether a transport failure in this process happened before the
    request left: the connection was refused or never made. Only the local
    exceptions behind `e` count, never what a server said."""
    cause: BaseException | None = e.__cause__
    seen = 0
    while cause is not None and seen < 8:
        if isinstance(cause, (ConnectionRefusedError, pyqwest.ConnectTimeout, socket.gaierror)):
            return True
        text = str(cause).lower()
        if (
            "connection refused" in text
            or "error trying to connect" in text
            or "tcp connect error" in text
            or "dns error" in text
        ):
            return True
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return False


def _fingerprint_hex(text: str) -> str:
    value = text.strip().lower()
    if value.startswith("sha256:"):
        value = value[len("sha256:") :]
    return value.replace(":", "")


def ca_by_fingerprint(url: str, fingerprint: str, timeout: float = 10.0) -> bytes:
    """The CA of an appliance whose certificate has `fingerprint` (the
    ``certificate sha256:...`` line it prints at start): the server's own
    certificate is checked against the fingerprint on a handshake that
    proves the server holds its key, and the CA it sends with it (the last
    certificate of its chain) becomes the one every later connection is
    verified against. A certificate that does not match is refused."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 443
    want = _fingerprint_hex(fingerprint)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=timeout) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            chain: list[Any]
            if hasattr(tls, "get_unverified_chain"):  # Python 3.13
                chain = list(tls.get_unverified_chain())
            else:
                chain = list(tls._sslobj.get_unverified_chain())  # type: ignore[union-attr]
    ders = [c if isinstance(c, bytes) else c.public_bytes(ssl._ssl.ENCODING_DER) for c in chain]  # type: ignore[attr-defined]
    if not ders:
        raise errors.AgentbayError("unavailable", f"{url} sent no certificate")
    got = hashlib.sha256(ders[0]).hexdigest()
    if got != want:
        raise errors.AgentbayError(
            "unauthenticated",
            f"{url} presented certificate sha256:{got}, not the pinned sha256:{want}",
        )
    if len(ders) < 2:
        raise errors.AgentbayError(
            "unauthenticated",
            f"{url} sent its certificate without the CA: pin its ca.pem instead",
        )
    return ssl.DER_cert_to_PEM_cert(ders[-1]).encode()


def load_ca(url: str, ca: str | bytes | os.PathLike[str] | None, fingerprint: str | None) -> bytes:
    """The PEM of the CA to verify the appliance against: `ca` (PEM bytes
    or a path to ca.pem), else the CA behind the pinned fingerprint."""
    if isinstance(ca, bytes):
        return ca
    if ca is not None:
        with open(ca, "rb") as f:
            return f.read()
    if fingerprint:
        return ca_by_fingerprint(url, fingerprint)
    raise errors.AgentbayError(
        "invalid_argument",
        "no CA to verify the appliance against: pass ca= (its tls/ca.pem) or "
        "fingerprint= (the certificate sha256 it prints at start), or set "
        "AGENTBAY_CA or AGENTBAY_FINGERPRINT",
    )


class TokenSource:
    """A bearer token for a client credential, fetched from
    ``/oauth/token`` and renewed a minute before it expires or when the
    appliance no longer accepts it (a restart with a new signing key, a
    revoked token). A fixed token (``token=``) is used as given."""

    def __init__(
        self,
        url: str,
        http: pyqwest.SyncClient,
        client_id: str | None,
        client_secret: str | None,
        token: str | None,
    ) -> None:
        if token is None and not (client_id and client_secret):
            raise errors.AgentbayError(
                "invalid_argument",
                "no credential: pass client_id= and client_secret= (or token=), or "
                "set AGENTBAY_CLIENT_ID and AGENTBAY_CLIENT_SECRET",
            )
        self._url = url
        self._http = http
        self._credential = (client_id, client_secret) if token is None else None
        self._token = token
        self._renew_at = float("inf") if token is not None else 0.0
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            if self._token is None or time.monotonic() >= self._renew_at:
                self._fetch()
            assert self._token is not None
            return self._token

    def invalidate(self, stale: str) -> bool:
        """Forgets `stale`; whether a new token can be fetched."""
        with self._lock:
            if self._credential is None:
                return False
            if self._token == stale:
                self._token = None
            return True

    def _fetch(self) -> None:
        assert self._credential is not None
        cid, secret = self._credential
        basic = base64.b64encode(f"{cid}:{secret}".encode()).decode()
        delay = 0.5
        deadline = time.monotonic() + 120
        while True:
            try:
                r = self._http.post(
                    f"{self._url}/oauth/token",
                    headers={
                        "authorization": f"Basic {basic}",
                        "content-type": "application/x-www-form-urlencoded",
                    },
                    content=b"grant_type=client_credentials",
                    timeout=30,
                )
            except Exception as e:  # the appliance is restarting
                if time.monotonic() > deadline:
                    raise errors.Unavailable("unavailable", f"{self._url}/oauth/token: {e}") from e
                time.sleep(delay)
                delay = min(delay * 2, 10)
                continue
            try:
                body: dict[str, Any] = json.loads(r.content or b"{}")
            except ValueError:
                body = {}
            if r.status == 200:
                self._token = str(body["access_token"])
                self._renew_at = time.monotonic() + max(int(body.get("expires_in", 900)) - 60, 1)
                return
            if r.status in (502, 503, 504) and time.monotonic() < deadline:
                time.sleep(delay)
                delay = min(delay * 2, 10)
                continue
            detail = body.get("error_description") or body.get("detail") or body.get("error") or r.status
            facts: dict[str, Any] = {}
            retry_after = r.headers.get("retry-after")
            if retry_after:
                facts["retryAfterSeconds"] = retry_after
            cls: type[errors.AgentbayError] = {
                400: errors.InvalidArgument,
                401: errors.Unauthenticated,
                403: errors.PermissionDenied,
                429: errors.ResourceExhausted,
            }.get(r.status, errors.AgentbayError)
            raise cls(
                str(body.get("error", r.status)),
                f"the token endpoint refused the credential: {detail}",
                facts=facts,
                method="oauth/token",
            )


class Retry:
    """How long a call is tried again while the appliance is unreachable
    (restarting, upgrading, draining)."""

    def __init__(self, within: float = 300.0, first: float = 0.25, longest: float = 15.0) -> None:
        self.within = within
        self.first = first
        self.longest = longest

    def delays(self) -> Callable[[], float | None]:
        """A generator of waits; None when the time is up."""
        deadline = time.monotonic() + self.within
        delay = self.first

        def next_delay() -> float | None:
            nonlocal delay
            if time.monotonic() >= deadline:
                return None
            d = min(delay, max(deadline - time.monotonic(), 0.0))
            delay = min(delay * 2, self.longest)
            return d * (0.8 + 0.4 * random.random())

        return next_delay


def _fresh_deadline(ctx: Any, budget_ms: float | None) -> None:
    """Gives a try sent again the whole timeout, not what the first try
    left of it (connect-python 0.9 keeps the deadline on the context)."""
    if budget_ms is not None and hasattr(ctx, "_end_time"):
        ctx._end_time = time.monotonic() + budget_ms / 1000.0


def _worth_again(e: ConnectError, safe: bool) -> bool:
    if e.code == Code.DEADLINE_EXCEEDED:
        # A connection that was never made (connect timeout) sent nothing.
        return never_sent(e)
    if e.code not in (Code.UNAVAILABLE, Code.UNKNOWN):
        return False
    return safe or never_sent(e)


class AuthRetrySync:
    """The interceptor of every sync client: the bearer token on each
    call, one renewal on `unauthenticated`, and calls tried again on a lost
    connection by the rule of :func:`repeatable`."""

    def __init__(self, tokens: TokenSource, retry: Retry) -> None:
        self._tokens = tokens
        self._retry = retry

    def intercept_unary_sync(self, call_next: Any, request: Any, ctx: Any) -> Any:
        m = ctx.method()
        safe = repeatable(m.service_name, m.name, m.idempotency_level)
        delays = self._retry.delays()
        budget = ctx.timeout_ms()
        renewed = False
        while True:
            _fresh_deadline(ctx, budget)
            token = self._tokens.get()
            ctx.request_headers()["authorization"] = f"Bearer {token}"
            try:
                return call_next(request, ctx)
            except ConnectError as e:
                if e.code == Code.UNAUTHENTICATED and not renewed and self._tokens.invalidate(token):
                    renewed = True
                    continue
                if _worth_again(e, safe):
                    d = delays()
                    if d is not None:
                        time.sleep(d)
                        continue
                raise errors.from_connect(e, f"{m.service_name}/{m.name}") from e

    def intercept_server_stream_sync(self, call_next: Any, request: Any, ctx: Any) -> Any:
        m = ctx.method()
        ctx.request_headers()["authorization"] = f"Bearer {self._tokens.get()}"
        try:
            yield from call_next(request, ctx)
        except ConnectError as e:
            raise errors.from_connect(e, f"{m.service_name}/{m.name}") from e


class AuthRetry:
    """The interceptor of every async client (as :class:`AuthRetrySync`)."""

    def __init__(self, tokens: TokenSource, retry: Retry) -> None:
        self._tokens = tokens
        self._retry = retry

    async def _token(self) -> str:
        return await asyncio.to_thread(self._tokens.get)

    async def intercept_unary(self, call_next: Any, request: Any, ctx: Any) -> Any:
        m = ctx.method()
        safe = repeatable(m.service_name, m.name, m.idempotency_level)
        delays = self._retry.delays()
        budget = ctx.timeout_ms()
        renewed = False
        while True:
            _fresh_deadline(ctx, budget)
            token = await self._token()
            ctx.request_headers()["authorization"] = f"Bearer {token}"
            try:
                return await call_next(request, ctx)
            except ConnectError as e:
                if e.code == Code.UNAUTHENTICATED and not renewed and self._tokens.invalidate(token):
                    renewed = True
                    continue
                if _worth_again(e, safe):
                    d = delays()
                    if d is not None:
                        await asyncio.sleep(d)
                        continue
                raise errors.from_connect(e, f"{m.service_name}/{m.name}") from e

    async def intercept_server_stream(self, call_next: Any, request: Any, ctx: Any) -> Any:
        m = ctx.method()
        ctx.request_headers()["authorization"] = f"Bearer {await self._token()}"
        try:
            async for item in call_next(request, ctx):
                yield item
        except ConnectError as e:
            raise errors.from_connect(e, f"{m.service_name}/{m.name}") from e
