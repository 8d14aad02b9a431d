"""Refusals of the appliance, as exceptions that carry the problem's facts.

Every RPC error is raised as an :class:`AgentbayError` subclass chosen by its
Connect code. The appliance attaches the facts of a refusal as a
``google.rpc.ErrorInfo`` detail (a denied lease's ``leaseId``, the
``limitingQuota``, a queue ``position``, ``retryAfterSeconds``) and a wrong
input field as a ``google.rpc.BadRequest`` detail; both are decoded here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from google.rpc import error_details_pb2


@dataclass(frozen=True)
class FieldViolation:
    """One input field that was wrong, and why."""

    field: str
    description: str


class AgentbayError(Exception):
    """The appliance refused a call, or could not be reached.

    ``code`` is the Connect code (``"not_found"``, ``"aborted"``...),
    ``reason`` the stable reason of the refusal (``"RESOURCE_EXHAUSTED"``),
    ``facts`` its machine-readable facts and ``field_violations`` the input
    fields at fault.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        reason: str = "",
        facts: Mapping[str, Any] | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        method: str = "",
    ) -> None:
        super().__init__(f"{method}: {code}: {message}" if method else f"{code}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.facts: dict[str, Any] = dict(facts or {})
        self.field_violations = field_violations
        self.method = method
        #: True when the failure arose in this process (the connection),
        #: not in an answer of the appliance: whether the request was
        #: acted on is then unknown.
        self.local = False

    @property
    def field(self) -> str | None:
        """The first input field at fault, if any."""
        if self.field_violations:
            return self.field_violations[0].field
        value = self.facts.get("field")
        return value if isinstance(value, str) else None

    @property
    def limiting_quota(self) -> str | None:
        """The quota that denied a lease (capacity refusals)."""
        value = self.facts.get("limitingQuota")
        return None if value is None else str(value)

    @property
    def lease_id(self) -> str | None:
        """The lease a refusal is about (a denied or queued lease)."""
        value = self.facts.get("leaseId")
        return None if value is None else str(value)

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before trying again, when the appliance said."""
        value = self.facts.get("retryAfterSeconds")
        try:
            return None if value is None else float(value)
        except (TypeError, ValueError):
            return None


class InvalidArgument(AgentbayError):
    """A field of the request was wrong (see ``field_violations``)."""


class Unauthenticated(AgentbayError):
    """The credential or token was not accepted."""


class PermissionDenied(AgentbayError):
    """The caller lacks the scope, or the resource is another tenant's."""


class NotFound(AgentbayError):
    """The resource does not exist (in the caller's tenant)."""


class AlreadyExists(AgentbayError):
    """The resource exists already."""


class FailedPrecondition(AgentbayError):
    """The resource is not in a state that allows the call."""


class Aborted(AgentbayError):
    """A stale fencing token, an interrupted or ended attempt: stop."""


class ResourceExhausted(AgentbayError):
    """A limit, a quota or a rate was reached (see ``limiting_quota``,
    ``lease_id`` and ``retry_after``)."""


class Unavailable(AgentbayError):
    """The appliance or a server behind it did not answer; worth another try."""


class DeadlineExceeded(AgentbayError):
    """The call took longer than its timeout."""


_BY_CODE: dict[Code, type[AgentbayError]] = {
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.UNAUTHENTICATED: Unauthenticated,
    Code.PERMISSION_DENIED: PermissionDenied,
    Code.NOT_FOUND: NotFound,
    Code.ALREADY_EXISTS: AlreadyExists,
    Code.FAILED_PRECONDITION: FailedPrecondition,
    Code.ABORTED: Aborted,
    Code.RESOURCE_EXHAUSTED: ResourceExhausted,
    Code.UNAVAILABLE: Unavailable,
    Code.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def _fact(text: str) -> Any:
    """A metadata value: non-string facts travel JSON-encoded."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def from_connect(e: ConnectError, method: str = "") -> AgentbayError:
    """The typed exception for a Connect error, with its details decoded."""
    reason = ""
    facts: dict[str, Any] = {}
    violations: list[FieldViolation] = []
    for detail in e.details:
        name = detail.type_url.rsplit("/", 1)[-1]
        if name == "google.rpc.ErrorInfo":
            info = error_details_pb2.ErrorInfo.FromString(detail.value)
            reason = info.reason
            facts.update({k: _fact(v) for k, v in info.metadata.items()})
        elif name == "google.rpc.BadRequest":
            bad = error_details_pb2.BadRequest.FromString(detail.value)
            violations.extend(
                FieldViolation(v.field, v.description) for v in bad.field_violations
            )
    cls = _BY_CODE.get(e.code, AgentbayError)
    error = cls(
        e.code.value,
        e.message,
        reason=reason,
        facts=facts,
        field_violations=tuple(violations),
        method=method,
    )
    error.local = e.__cause__ is not None
    return error


class Interrupted(Exception):
    """The attempt was interrupted or cancelled (or its fence went stale):
    the handler must stop; nothing it does after this is accepted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Uncertain(Exception):
    """A call was issued and its effect cannot be confirmed: it is never
    tried again by the SDK; an operator settles it (``Runs/SettleCall``)."""

    def __init__(self, call_id: str, reason: str) -> None:
        super().__init__(f"call {call_id}: {reason}")
        self.call_id = call_id
        self.reason = reason


class Refused(Exception):
    """The appliance refused to issue a call (tool closure, schema, policy,
    a rejected approval): recorded as a failed call; the handler decides."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"{target}: {reason}")
        self.target = target
        self.reason = reason
