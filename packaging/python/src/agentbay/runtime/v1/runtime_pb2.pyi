from agentbay.runs.v1 import runs_pb2 as _runs_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InterruptRequest(_message.Message):
    __slots__ = ("attempt_id", "reason", "tenant_id")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    reason: str
    tenant_id: str
    def __init__(self, attempt_id: _Optional[str] = ..., reason: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class InterruptResponse(_message.Message):
    __slots__ = ("state", "observed", "waiting_reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    state: str
    observed: bool
    waiting_reason: str
    def __init__(self, state: _Optional[str] = ..., observed: _Optional[bool] = ..., waiting_reason: _Optional[str] = ...) -> None: ...

class AnswerDecisionRequest(_message.Message):
    __slots__ = ("attempt_id", "decision_id", "choice", "answer_json", "tenant_id")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    decision_id: str
    choice: str
    answer_json: str
    tenant_id: str
    def __init__(self, attempt_id: _Optional[str] = ..., decision_id: _Optional[str] = ..., choice: _Optional[str] = ..., answer_json: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class AnswerDecisionResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    def __init__(self, state: _Optional[str] = ...) -> None: ...

class WatchAttemptRequest(_message.Message):
    __slots__ = ("attempt_id", "after_sequence", "tenant_id", "model_text", "text_offset")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    after_sequence: int
    tenant_id: str
    model_text: bool
    text_offset: int
    def __init__(self, attempt_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., tenant_id: _Optional[str] = ..., model_text: _Optional[bool] = ..., text_offset: _Optional[int] = ...) -> None: ...

class ModelText(_message.Message):
    __slots__ = ("offset", "call_id", "kind", "text", "discard_from", "reason", "up_to")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DISCARD_FROM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UP_TO_FIELD_NUMBER: _ClassVar[int]
    offset: int
    call_id: str
    kind: str
    text: str
    discard_from: int
    reason: str
    up_to: int
    def __init__(self, offset: _Optional[int] = ..., call_id: _Optional[str] = ..., kind: _Optional[str] = ..., text: _Optional[str] = ..., discard_from: _Optional[int] = ..., reason: _Optional[str] = ..., up_to: _Optional[int] = ...) -> None: ...

class AttemptUpdate(_message.Message):
    __slots__ = ("attempt_id", "state", "phase", "checkpoints", "last_checkpoint_id", "waiting_reason", "interrupt_requested", "interrupt_reason", "fencing_token", "outcome_hash", "version", "pending_decision", "sequence", "topic", "occurred_at", "event_json", "text")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REASON_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_HASH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PENDING_DECISION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    state: str
    phase: str
    checkpoints: int
    last_checkpoint_id: str
    waiting_reason: str
    interrupt_requested: bool
    interrupt_reason: str
    fencing_token: int
    outcome_hash: str
    version: int
    pending_decision: _runs_pb2.PendingDecision
    sequence: int
    topic: str
    occurred_at: str
    event_json: str
    text: ModelText
    def __init__(self, attempt_id: _Optional[str] = ..., state: _Optional[str] = ..., phase: _Optional[str] = ..., checkpoints: _Optional[int] = ..., last_checkpoint_id: _Optional[str] = ..., waiting_reason: _Optional[str] = ..., interrupt_requested: _Optional[bool] = ..., interrupt_reason: _Optional[str] = ..., fencing_token: _Optional[int] = ..., outcome_hash: _Optional[str] = ..., version: _Optional[int] = ..., pending_decision: _Optional[_Union[_runs_pb2.PendingDecision, _Mapping]] = ..., sequence: _Optional[int] = ..., topic: _Optional[str] = ..., occurred_at: _Optional[str] = ..., event_json: _Optional[str] = ..., text: _Optional[_Union[ModelText, _Mapping]] = ...) -> None: ...
