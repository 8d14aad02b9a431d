from agentbay.runtime.v1 import runtime_pb2 as _runtime_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BeginOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BEGIN_OUTCOME_UNSPECIFIED: _ClassVar[BeginOutcome]
    STARTED: _ClassVar[BeginOutcome]
    REFUSED: _ClassVar[BeginOutcome]
    APPROVAL_REQUIRED: _ClassVar[BeginOutcome]
    REPLAYED: _ClassVar[BeginOutcome]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERIFIED: _ClassVar[Verdict]
    CORRECT: _ClassVar[Verdict]
    EXHAUSTED: _ClassVar[Verdict]
    FAILED: _ClassVar[Verdict]
BEGIN_OUTCOME_UNSPECIFIED: BeginOutcome
STARTED: BeginOutcome
REFUSED: BeginOutcome
APPROVAL_REQUIRED: BeginOutcome
REPLAYED: BeginOutcome
VERDICT_UNSPECIFIED: Verdict
VERIFIED: Verdict
CORRECT: Verdict
EXHAUSTED: Verdict
FAILED: Verdict

class ClaimAttemptRequest(_message.Message):
    __slots__ = ("agent_id", "session", "wait_seconds")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session: str
    wait_seconds: int
    def __init__(self, agent_id: _Optional[str] = ..., session: _Optional[str] = ..., wait_seconds: _Optional[int] = ...) -> None: ...

class AttemptTicket(_message.Message):
    __slots__ = ("attempt_id", "run_id", "step_id", "fencing_token", "release_id", "agent_id", "input_json", "resumed", "state_json", "checkpoint_sequence", "phase", "correction_count", "max_corrections", "max_minutes", "max_model_calls", "max_tool_calls", "max_context_tokens", "lease_expires_at", "adapter_version", "checkpoint_format", "rerun_of_attempt_id", "rerun_of_checkpoint_sequence", "model_profile_id", "max_total_tokens")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_CORRECTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_MINUTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_CHECKPOINT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    run_id: str
    step_id: str
    fencing_token: int
    release_id: str
    agent_id: str
    input_json: str
    resumed: bool
    state_json: str
    checkpoint_sequence: int
    phase: str
    correction_count: int
    max_corrections: int
    max_minutes: int
    max_model_calls: int
    max_tool_calls: int
    max_context_tokens: int
    lease_expires_at: str
    adapter_version: str
    checkpoint_format: int
    rerun_of_attempt_id: str
    rerun_of_checkpoint_sequence: int
    model_profile_id: str
    max_total_tokens: int
    def __init__(self, attempt_id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., release_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., input_json: _Optional[str] = ..., resumed: _Optional[bool] = ..., state_json: _Optional[str] = ..., checkpoint_sequence: _Optional[int] = ..., phase: _Optional[str] = ..., correction_count: _Optional[int] = ..., max_corrections: _Optional[int] = ..., max_minutes: _Optional[int] = ..., max_model_calls: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., lease_expires_at: _Optional[str] = ..., adapter_version: _Optional[str] = ..., checkpoint_format: _Optional[int] = ..., rerun_of_attempt_id: _Optional[str] = ..., rerun_of_checkpoint_sequence: _Optional[int] = ..., model_profile_id: _Optional[str] = ..., max_total_tokens: _Optional[int] = ...) -> None: ...

class ClaimAttemptResponse(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: AttemptTicket
    def __init__(self, attempt: _Optional[_Union[AttemptTicket, _Mapping]] = ...) -> None: ...

class StartAttemptRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "adapter_version", "checkpoint_format", "context_snapshot_ref")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SNAPSHOT_REF_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    adapter_version: str
    checkpoint_format: int
    context_snapshot_ref: str
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., adapter_version: _Optional[str] = ..., checkpoint_format: _Optional[int] = ..., context_snapshot_ref: _Optional[str] = ...) -> None: ...

class AttemptStatus(_message.Message):
    __slots__ = ("attempt_id", "state", "phase", "fencing_token", "interrupt_requested", "interrupt_reason", "waiting_reason", "lease_expires_at", "failure_class", "failure_reason")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REASON_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    state: str
    phase: str
    fencing_token: int
    interrupt_requested: bool
    interrupt_reason: str
    waiting_reason: str
    lease_expires_at: str
    failure_class: str
    failure_reason: str
    def __init__(self, attempt_id: _Optional[str] = ..., state: _Optional[str] = ..., phase: _Optional[str] = ..., fencing_token: _Optional[int] = ..., interrupt_requested: _Optional[bool] = ..., interrupt_reason: _Optional[str] = ..., waiting_reason: _Optional[str] = ..., lease_expires_at: _Optional[str] = ..., failure_class: _Optional[str] = ..., failure_reason: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class BeginCallRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "kind", "target", "request_json", "context_tokens", "approval_id", "state_json", "require_approval")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    kind: str
    target: str
    request_json: str
    context_tokens: int
    approval_id: str
    state_json: str
    require_approval: bool
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., kind: _Optional[str] = ..., target: _Optional[str] = ..., request_json: _Optional[str] = ..., context_tokens: _Optional[int] = ..., approval_id: _Optional[str] = ..., state_json: _Optional[str] = ..., require_approval: _Optional[bool] = ...) -> None: ...

class BeginCallResponse(_message.Message):
    __slots__ = ("outcome", "call_id", "policy_decision_id", "fencing_token", "reason", "decision_id", "approval_id", "checkpoint_id", "child_run_id", "request_hash", "replayed_from_call_id", "result_json")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FROM_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    outcome: BeginOutcome
    call_id: str
    policy_decision_id: str
    fencing_token: int
    reason: str
    decision_id: str
    approval_id: str
    checkpoint_id: str
    child_run_id: str
    request_hash: str
    replayed_from_call_id: str
    result_json: str
    def __init__(self, outcome: _Optional[_Union[BeginOutcome, str]] = ..., call_id: _Optional[str] = ..., policy_decision_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., reason: _Optional[str] = ..., decision_id: _Optional[str] = ..., approval_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., child_run_id: _Optional[str] = ..., request_hash: _Optional[str] = ..., replayed_from_call_id: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class CompleteCallRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "call_id", "ok", "result_json", "receipt_json", "error", "state_json", "usage", "latency_ms")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    call_id: str
    ok: bool
    result_json: str
    receipt_json: str
    error: str
    state_json: str
    usage: ModelUsage
    latency_ms: int
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., call_id: _Optional[str] = ..., ok: _Optional[bool] = ..., result_json: _Optional[str] = ..., receipt_json: _Optional[str] = ..., error: _Optional[str] = ..., state_json: _Optional[str] = ..., usage: _Optional[_Union[ModelUsage, _Mapping]] = ..., latency_ms: _Optional[int] = ...) -> None: ...

class ModelUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cached_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class CompleteCallResponse(_message.Message):
    __slots__ = ("state", "checkpoint_id", "checkpoint_sequence", "result_hash", "receipt_ref", "interrupt_requested")
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RESULT_HASH_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_REF_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    state: str
    checkpoint_id: str
    checkpoint_sequence: int
    result_hash: str
    receipt_ref: str
    interrupt_requested: bool
    def __init__(self, state: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., checkpoint_sequence: _Optional[int] = ..., result_hash: _Optional[str] = ..., receipt_ref: _Optional[str] = ..., interrupt_requested: _Optional[bool] = ...) -> None: ...

class CallModelRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "messages_json", "tools_json", "context_tokens", "state_json")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    messages_json: str
    tools_json: str
    context_tokens: int
    state_json: str
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., messages_json: _Optional[str] = ..., tools_json: _Optional[str] = ..., context_tokens: _Optional[int] = ..., state_json: _Optional[str] = ...) -> None: ...

class CallModelResponse(_message.Message):
    __slots__ = ("outcome", "call_id", "reason", "content", "tool_calls_json", "input_tokens", "output_tokens", "model", "served_by", "latency_ms", "checkpoint_id", "checkpoint_sequence", "interrupt_requested", "cached_tokens")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    outcome: BeginOutcome
    call_id: str
    reason: str
    content: str
    tool_calls_json: str
    input_tokens: int
    output_tokens: int
    model: str
    served_by: str
    latency_ms: int
    checkpoint_id: str
    checkpoint_sequence: int
    interrupt_requested: bool
    cached_tokens: int
    def __init__(self, outcome: _Optional[_Union[BeginOutcome, str]] = ..., call_id: _Optional[str] = ..., reason: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls_json: _Optional[str] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., model: _Optional[str] = ..., served_by: _Optional[str] = ..., latency_ms: _Optional[int] = ..., checkpoint_id: _Optional[str] = ..., checkpoint_sequence: _Optional[int] = ..., interrupt_requested: _Optional[bool] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class StreamModelUpdate(_message.Message):
    __slots__ = ("text", "reply")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    text: _runtime_pb2.ModelText
    reply: CallModelResponse
    def __init__(self, text: _Optional[_Union[_runtime_pb2.ModelText, _Mapping]] = ..., reply: _Optional[_Union[CallModelResponse, _Mapping]] = ...) -> None: ...

class AwaitCallRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "call_id", "wait_seconds")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    call_id: str
    wait_seconds: int
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., call_id: _Optional[str] = ..., wait_seconds: _Optional[int] = ...) -> None: ...

class AwaitCallResponse(_message.Message):
    __slots__ = ("status", "result_json", "error")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    status: str
    result_json: str
    error: str
    def __init__(self, status: _Optional[str] = ..., result_json: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "state_json", "phase")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    state_json: str
    phase: str
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., state_json: _Optional[str] = ..., phase: _Optional[str] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_id", "sequence", "state", "hash")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    sequence: int
    state: str
    hash: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., sequence: _Optional[int] = ..., state: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class RequestDecisionRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "kind", "question_json", "summary", "options", "recommendation", "assignee", "answer_schema_json")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    QUESTION_JSON_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNEE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    kind: str
    question_json: str
    summary: str
    options: _containers.RepeatedScalarFieldContainer[str]
    recommendation: str
    assignee: str
    answer_schema_json: str
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., kind: _Optional[str] = ..., question_json: _Optional[str] = ..., summary: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ..., recommendation: _Optional[str] = ..., assignee: _Optional[str] = ..., answer_schema_json: _Optional[str] = ...) -> None: ...

class RequestDecisionResponse(_message.Message):
    __slots__ = ("decision_id", "expires_at")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    expires_at: str
    def __init__(self, decision_id: _Optional[str] = ..., expires_at: _Optional[str] = ...) -> None: ...

class AwaitDecisionRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "decision_id", "wait_seconds")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    decision_id: str
    wait_seconds: int
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., decision_id: _Optional[str] = ..., wait_seconds: _Optional[int] = ...) -> None: ...

class AwaitDecisionResponse(_message.Message):
    __slots__ = ("status", "choice", "answer_json", "reason", "answered_by", "attempt_state", "approved_arguments_json", "responded")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_STATE_FIELD_NUMBER: _ClassVar[int]
    APPROVED_ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESPONDED_FIELD_NUMBER: _ClassVar[int]
    status: str
    choice: str
    answer_json: str
    reason: str
    answered_by: str
    attempt_state: str
    approved_arguments_json: str
    responded: bool
    def __init__(self, status: _Optional[str] = ..., choice: _Optional[str] = ..., answer_json: _Optional[str] = ..., reason: _Optional[str] = ..., answered_by: _Optional[str] = ..., attempt_state: _Optional[str] = ..., approved_arguments_json: _Optional[str] = ..., responded: _Optional[bool] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("attempt_id", "fencing_token", "succeeded", "output_json", "failure_class", "reason", "error_type", "error_message", "traceback")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    fencing_token: int
    succeeded: bool
    output_json: str
    failure_class: str
    reason: str
    error_type: str
    error_message: str
    traceback: str
    def __init__(self, attempt_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., succeeded: _Optional[bool] = ..., output_json: _Optional[str] = ..., failure_class: _Optional[str] = ..., reason: _Optional[str] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("verdict", "feedback", "corrections_left", "state", "outcome_hash", "acknowledged")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    CORRECTIONS_LEFT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_HASH_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    feedback: str
    corrections_left: int
    state: str
    outcome_hash: str
    acknowledged: bool
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., feedback: _Optional[str] = ..., corrections_left: _Optional[int] = ..., state: _Optional[str] = ..., outcome_hash: _Optional[str] = ..., acknowledged: _Optional[bool] = ...) -> None: ...
