"""Clients of an agentbay appliance: every RPC of its five services, sync
(:class:`Client`) and async (:class:`AsyncClient`), over HTTPS with the
appliance's CA pinned and a client-credential token.

    from agentbay import Client
    from agentbay.runs.v1 import runs_pb2

    with Client.from_env() as ab:
        run = ab.runs.get_run(runs_pb2.GetRunRequest(run_id="..."))

The services are the generated Connect clients (``agentbay.<service>.v1.
<service>_connect``): their methods take and return the generated
protobuf messages, and raise :mod:`agentbay.errors` exceptions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self

import pyqwest

from ._connection import (
    DEFAULT_URL,
    AuthRetry,
    AuthRetrySync,
    Retry,
    TokenSource,
    load_ca,
)
from .adapter.v1.adapter_connect import AdapterClient, AdapterClientSync
from .admin.v1.admin_connect import AdminClient, AdminClientSync
from .capacity.v1.capacity_connect import CapacityClient, CapacityClientSync
from .runs.v1.runs_connect import RunsClient, RunsClientSync
from .runtime.v1 import runtime_pb2
from .runtime.v1.runtime_connect import RuntimeClient, RuntimeClientSync


@dataclass(frozen=True)
class TextPiece:
    """A piece of an attempt's model text as it is written: ``kind`` text
    (``text`` at byte ``offset`` of the attempt's text stream), superseded
    (model call ``call_id`` failed and is tried again: discard its text
    from ``discard_from``), ended (the call's answer is whole) or gap (the
    stream no longer holds the text up to ``up_to``: read the calls'
    records). Reconnect from :attr:`end` of the last piece you have."""

    offset: int
    call_id: str
    kind: str
    text: str = ""
    discard_from: int = 0
    reason: str = ""
    up_to: int = 0

    @property
    def end(self) -> int:
        """Where the next piece begins."""
        return self.up_to if self.kind == "gap" else self.offset + len(self.text.encode())

    @classmethod
    def of(cls, m: Any) -> TextPiece:
        return cls(m.offset, m.call_id, m.kind, m.text, m.discard_from, m.reason, m.up_to)


def _settings(
    url: str | None,
    ca: str | bytes | os.PathLike[str] | None,
    fingerprint: str | None,
    client_id: str | None,
    client_secret: str | None,
    token: str | None,
    env: bool,
) -> dict[str, Any]:
    def pick(value: Any, name: str) -> Any:
        if value is None and env:
            return os.environ.get(name) or None
        return value

    return {
        "url": (pick(url, "AGENTBAY_URL") or DEFAULT_URL).rstrip("/"),
        "ca": pick(ca, "AGENTBAY_CA"),
        "fingerprint": pick(fingerprint, "AGENTBAY_FINGERPRINT"),
        "client_id": pick(client_id, "AGENTBAY_CLIENT_ID"),
        "client_secret": pick(client_secret, "AGENTBAY_CLIENT_SECRET"),
        "token": pick(token, "AGENTBAY_TOKEN"),
    }


def _transport_options(ca_pem: bytes, timeout: float) -> dict[str, Any]:
    """The HTTPS transport to one appliance: its CA only; HTTP/1.1 with
    keep-alive (Connect's unary calls and streams need nothing more, and on
    a site's network it answers a call about a fifth sooner than HTTP/2);
    no OpenTelemetry spans of its own (the appliance traces every call)."""
    return {
        "tls_ca_cert": ca_pem,
        "connect_timeout": 10.0,
        "read_timeout": timeout,
        "http_version": pyqwest.HTTPVersion.HTTP1,
        "enable_otel": False,
    }


class _Base:
    """What both clients are: settings, the pinned CA, the token source,
    one HTTPS transport and the five services over it. A subclass names its
    transport, HTTP client, interceptor and service classes."""

    url: str
    ca_pem: bytes
    tokens: TokenSource
    _transport_type: Any
    _http_type: Any
    _interceptor_type: Any
    _services: tuple[tuple[str, Any], ...]

    def __init__(
        self,
        url: str | None = None,
        *,
        ca: str | bytes | os.PathLike[str] | None = None,
        fingerprint: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        token: str | None = None,
        timeout: float = 120.0,
        retry_within: float = 300.0,
        binary: bool = True,
        _env: bool = False,
    ) -> None:
        s = _settings(url, ca, fingerprint, client_id, client_secret, token, _env)
        self.url = s["url"]
        self.ca_pem = load_ca(self.url, s["ca"], s["fingerprint"])
        # The token endpoint is reached over the same pinned TLS.
        self._token_transport = pyqwest.SyncHTTPTransport(**_transport_options(self.ca_pem, 30.0))
        self.tokens = TokenSource(
            self.url, pyqwest.SyncClient(self._token_transport), s["client_id"], s["client_secret"], s["token"]
        )
        self._transport = self._transport_type(**_transport_options(self.ca_pem, timeout))
        options: dict[str, Any] = {
            "proto_json": not binary,
            "timeout_ms": int(timeout * 1000),
            "interceptors": [self._interceptor_type(self.tokens, Retry(retry_within))],
            "http_client": self._http_type(self._transport),
            # Requests are small; compressing each costs more than it saves.
            "send_compression": None,
        }
        for name, service in self._services:
            setattr(self, name, service(self.url, **options))

    @classmethod
    def from_env(cls, **overrides: Any) -> Self:
        """A client configured from ``AGENTBAY_*`` environment variables;
        keyword arguments win."""
        return cls(_env=True, **overrides)


class Client(_Base):
    """A synchronous client of one appliance.

    ``url`` defaults to ``https://127.0.0.1:8443``; ``ca`` is the
    appliance's ``tls/ca.pem`` (a path or PEM bytes) or ``fingerprint`` the
    ``certificate sha256:...`` it prints at start; ``client_id`` and
    ``client_secret`` a client credential (``agentbay client create``), or
    ``token`` a bearer token. :meth:`from_env` reads the same from
    ``AGENTBAY_URL``, ``AGENTBAY_CA``, ``AGENTBAY_FINGERPRINT``,
    ``AGENTBAY_CLIENT_ID``, ``AGENTBAY_CLIENT_SECRET`` and ``AGENTBAY_TOKEN``.
    ``retry_within`` is how long a call is tried again while the appliance
    cannot be reached (see :func:`agentbay._connection.repeatable`).
    ``timeout`` bounds each try of a call, streams too: pass ``timeout_ms=``
    to a long ``watch_attempt`` or ``watch_events``.
    """

    adapter: AdapterClientSync
    runs: RunsClientSync
    runtime: RuntimeClientSync
    capacity: CapacityClientSync
    admin: AdminClientSync
    _transport_type = pyqwest.SyncHTTPTransport
    _http_type = pyqwest.SyncClient
    _interceptor_type = AuthRetrySync
    _services = (
        ("adapter", AdapterClientSync),
        ("runs", RunsClientSync),
        ("runtime", RuntimeClientSync),
        ("capacity", CapacityClientSync),
        ("admin", AdminClientSync),
    )

    def follow(self, attempt_id: str, from_offset: int = 0, *, tenant_id: str = "",
               timeout_ms: int = 3_600_000) -> Iterator[TextPiece]:
        """The attempt's model text as it is written, from byte
        `from_offset` of its text stream (``Runtime/WatchAttempt`` with
        ``model_text``), until the attempt has ended: each model turn's
        text in pieces (about every 100 ms), a ``superseded`` piece when a
        turn's call failed and is tried again. A reader that lost its
        connection follows again from the :attr:`TextPiece.end` of the last
        piece it has. Needs ``factory.runs.read``."""
        request = runtime_pb2.WatchAttemptRequest(
            attempt_id=attempt_id, tenant_id=tenant_id, model_text=True, text_offset=from_offset,
        )
        for update in self.runtime.watch_attempt(request, timeout_ms=timeout_ms):
            if update.HasField("text"):
                yield TextPiece.of(update.text)

    def close(self) -> None:
        """Closes the connections (the services' and the token endpoint's)."""
        for c in (self.adapter, self.runs, self.runtime, self.capacity, self.admin):
            c.close()
        self._transport.close()
        self._token_transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """An asynchronous client of one appliance (arguments as :class:`Client`)."""

    adapter: AdapterClient
    runs: RunsClient
    runtime: RuntimeClient
    capacity: CapacityClient
    admin: AdminClient
    _transport_type = pyqwest.HTTPTransport
    _http_type = pyqwest.Client
    _interceptor_type = AuthRetry
    _services = (
        ("adapter", AdapterClient),
        ("runs", RunsClient),
        ("runtime", RuntimeClient),
        ("capacity", CapacityClient),
        ("admin", AdminClient),
    )

    async def close(self) -> None:
        """Closes the connections (the services' and the token endpoint's)."""
        for c in (self.adapter, self.runs, self.runtime, self.capacity, self.admin):
            await c.close()
        await self._transport.aclose()
        self._token_transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
