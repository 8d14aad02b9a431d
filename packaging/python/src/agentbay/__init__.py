"""agentbay for Python: clients of the appliance's RPC (generated from its
.proto files), an external-adapter :class:`Worker`, and LangGraph graphs
run durably on agentbay (:mod:`agentbay.langgraph`, extra ``langgraph``),
agents of the OpenAI Agents SDK (:mod:`agentbay.openai_agents`, extra
``openai-agents``) and of Pydantic AI (:mod:`agentbay.pydantic_ai`, extra
``pydantic-ai``)."""

from .client import AsyncClient, Client, TextPiece
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
from .worker import (
    Answer,
    Context,
    Failed,
    Fence,
    RESTART,
    ModelReply,
    TextStream,
    ToolCall,
    Worker,
    current_context,
    current_fence,
    usage_of,
)

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
    "RESTART",
    "Refused",
    "ResourceExhausted",
    "TextPiece",
    "TextStream",
    "ToolCall",
    "Unauthenticated",
    "Unavailable",
    "Uncertain",
    "Worker",
    "current_context",
    "current_fence",
    "usage_of",
]
