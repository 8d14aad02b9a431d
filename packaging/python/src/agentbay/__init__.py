"""agentbay for Python: clients of the appliance's RPC (generated from its
.proto files), an external-adapter :class:`Worker`, and LangGraph graphs
run durably on agentbay (:mod:`agentbay.langgraph`, extra ``langgraph``)."""

from .client import AsyncClient, Client
from .errors import (
    Aborted,
    AgentbayError,
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    Interrupted,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Refused,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Uncertain,
)
from .worker import Answer, Context, Failed, Fence, ModelReply, ToolCall, Worker, usage_of

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "AgentbayError",
    "AlreadyExists",
    "Answer",
    "AsyncClient",
    "Client",
    "Context",
    "DeadlineExceeded",
    "Failed",
    "FailedPrecondition",
    "Fence",
    "FieldViolation",
    "Interrupted",
    "InvalidArgument",
    "ModelReply",
    "NotFound",
    "PermissionDenied",
    "Refused",
    "ResourceExhausted",
    "ToolCall",
    "Unauthenticated",
    "Unavailable",
    "Uncertain",
    "Worker",
    "usage_of",
]
