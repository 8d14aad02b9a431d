from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenUsage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "cached_tokens", "model_calls", "total_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    model_calls: int
    total_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., model_calls: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("tenant_id", "to", "group_by", "project_id", "agent_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    to: str
    group_by: str
    project_id: str
    agent_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., to: _Optional[str] = ..., group_by: _Optional[str] = ..., project_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., **kwargs) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("day", "project_id", "agent_id", "release_id", "usage")
    DAY_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    day: str
    project_id: str
    agent_id: str
    release_id: str
    usage: TokenUsage
    def __init__(self, day: _Optional[str] = ..., project_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., release_id: _Optional[str] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("rows", "total", "to")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    total: TokenUsage
    to: str
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., total: _Optional[_Union[TokenUsage, _Mapping]] = ..., to: _Optional[str] = ..., **kwargs) -> None: ...

class RerunFromCheckpointRequest(_message.Message):
    __slots__ = ("attempt_id", "checkpoint_sequence", "release_id", "reissue_call_ids", "request_id", "tenant_id")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REISSUE_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    checkpoint_sequence: int
    release_id: str
    reissue_call_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    tenant_id: str
    def __init__(self, attempt_id: _Optional[str] = ..., checkpoint_sequence: _Optional[int] = ..., release_id: _Optional[str] = ..., reissue_call_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class RerunFromCheckpointResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class RerunOrigin(_message.Message):
    __slots__ = ("run_id", "attempt_id", "checkpoint_id", "checkpoint_sequence", "release_id", "reissue_call_ids", "by", "at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REISSUE_CALL_IDS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    attempt_id: str
    checkpoint_id: str
    checkpoint_sequence: int
    release_id: str
    reissue_call_ids: _containers.RepeatedScalarFieldContainer[str]
    by: str
    at: str
    def __init__(self, run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., checkpoint_sequence: _Optional[int] = ..., release_id: _Optional[str] = ..., reissue_call_ids: _Optional[_Iterable[str]] = ..., by: _Optional[str] = ..., at: _Optional[str] = ...) -> None: ...

class HoldRunRequest(_message.Message):
    __slots__ = ("run_id", "reason", "release", "tenant_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    release: bool
    tenant_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., release: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class HoldRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class Hold(_message.Message):
    __slots__ = ("reason", "by", "at")
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    by: str
    at: str
    def __init__(self, reason: _Optional[str] = ..., by: _Optional[str] = ..., at: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_minutes", "max_model_calls", "max_tool_calls", "max_context_tokens", "max_sub_agent_depth", "max_total_tokens")
    MAX_MINUTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SUB_AGENT_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_minutes: int
    max_model_calls: int
    max_tool_calls: int
    max_context_tokens: int
    max_sub_agent_depth: int
    max_total_tokens: int
    def __init__(self, max_minutes: _Optional[int] = ..., max_model_calls: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., max_sub_agent_depth: _Optional[int] = ..., max_total_tokens: _Optional[int] = ...) -> None: ...

class SubmitRunRequest(_message.Message):
    __slots__ = ("project_id", "release_id", "input_json", "limits", "max_attempts", "max_corrections", "request_id", "environment_id", "tenant_id", "run_key", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CORRECTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    release_id: str
    input_json: str
    limits: Limits
    max_attempts: int
    max_corrections: int
    request_id: str
    environment_id: str
    tenant_id: str
    run_key: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, project_id: _Optional[str] = ..., release_id: _Optional[str] = ..., input_json: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., max_attempts: _Optional[int] = ..., max_corrections: _Optional[int] = ..., request_id: _Optional[str] = ..., environment_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., run_key: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt_id", "run_id", "step_id", "number", "state", "phase", "fencing_token", "waiting_reason", "limiting_quota", "queue_position", "correction_count", "max_corrections", "model_calls", "tool_calls", "failure_class", "failure_reason", "outcome_hash", "pending_decision_id", "release_id", "agent_id", "started_at", "ended_at", "checkpoints", "capacity_lease_id", "pending_decision", "tokens", "active_seconds", "wall_seconds")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    LIMITING_QUOTA_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_CORRECTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_HASH_FIELD_NUMBER: _ClassVar[int]
    PENDING_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_DECISION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    run_id: str
    step_id: str
    number: int
    state: str
    phase: str
    fencing_token: int
    waiting_reason: str
    limiting_quota: str
    queue_position: int
    correction_count: int
    max_corrections: int
    model_calls: int
    tool_calls: int
    failure_class: str
    failure_reason: str
    outcome_hash: str
    pending_decision_id: str
    release_id: str
    agent_id: str
    started_at: str
    ended_at: str
    checkpoints: int
    capacity_lease_id: str
    pending_decision: PendingDecision
    tokens: TokenUsage
    active_seconds: int
    wall_seconds: int
    def __init__(self, attempt_id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_id: _Optional[str] = ..., number: _Optional[int] = ..., state: _Optional[str] = ..., phase: _Optional[str] = ..., fencing_token: _Optional[int] = ..., waiting_reason: _Optional[str] = ..., limiting_quota: _Optional[str] = ..., queue_position: _Optional[int] = ..., correction_count: _Optional[int] = ..., max_corrections: _Optional[int] = ..., model_calls: _Optional[int] = ..., tool_calls: _Optional[int] = ..., failure_class: _Optional[str] = ..., failure_reason: _Optional[str] = ..., outcome_hash: _Optional[str] = ..., pending_decision_id: _Optional[str] = ..., release_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., started_at: _Optional[str] = ..., ended_at: _Optional[str] = ..., checkpoints: _Optional[int] = ..., capacity_lease_id: _Optional[str] = ..., pending_decision: _Optional[_Union[PendingDecision, _Mapping]] = ..., tokens: _Optional[_Union[TokenUsage, _Mapping]] = ..., active_seconds: _Optional[int] = ..., wall_seconds: _Optional[int] = ...) -> None: ...

class PendingDecision(_message.Message):
    __slots__ = ("decision_id", "kind", "approval_id", "summary", "question", "proposed_call", "options", "recommendation", "requested_at", "expires_at", "purged", "answer_schema_json", "assignee")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_CALL_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDATION_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    ASSIGNEE_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    kind: str
    approval_id: str
    summary: str
    question: str
    proposed_call: ProposedCall
    options: _containers.RepeatedScalarFieldContainer[str]
    recommendation: str
    requested_at: str
    expires_at: str
    purged: str
    answer_schema_json: str
    assignee: str
    def __init__(self, decision_id: _Optional[str] = ..., kind: _Optional[str] = ..., approval_id: _Optional[str] = ..., summary: _Optional[str] = ..., question: _Optional[str] = ..., proposed_call: _Optional[_Union[ProposedCall, _Mapping]] = ..., options: _Optional[_Iterable[str]] = ..., recommendation: _Optional[str] = ..., requested_at: _Optional[str] = ..., expires_at: _Optional[str] = ..., purged: _Optional[str] = ..., answer_schema_json: _Optional[str] = ..., assignee: _Optional[str] = ...) -> None: ...

class ProposedCall(_message.Message):
    __slots__ = ("kind", "target", "side_effect_class", "arguments_json", "request_hash", "policy_decision_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECT_CLASS_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    POLICY_DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    kind: str
    target: str
    side_effect_class: str
    arguments_json: str
    request_hash: str
    policy_decision_id: str
    def __init__(self, kind: _Optional[str] = ..., target: _Optional[str] = ..., side_effect_class: _Optional[str] = ..., arguments_json: _Optional[str] = ..., request_hash: _Optional[str] = ..., policy_decision_id: _Optional[str] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("step_id", "index", "name", "state", "attempts")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    step_id: str
    index: int
    name: str
    state: str
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    def __init__(self, step_id: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "tenant_id", "project_id", "release_id", "agent_id", "snapshot_id", "state", "reason", "steps", "output_json", "output_ref", "input_ref", "depth", "parent_run_id", "created_at", "ended_at", "cancel_requested", "max_attempts", "limits", "hold", "purged", "rerun_of", "rerun_ids", "tokens", "tokens_with_children", "run_key", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_REF_FIELD_NUMBER: _ClassVar[int]
    INPUT_REF_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    PURGED_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    RERUN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_WITH_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    RUN_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_id: str
    project_id: str
    release_id: str
    agent_id: str
    snapshot_id: str
    state: str
    reason: str
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    output_json: str
    output_ref: str
    input_ref: str
    depth: int
    parent_run_id: str
    created_at: str
    ended_at: str
    cancel_requested: bool
    max_attempts: int
    limits: Limits
    hold: Hold
    purged: str
    rerun_of: RerunOrigin
    rerun_ids: _containers.RepeatedScalarFieldContainer[str]
    tokens: TokenUsage
    tokens_with_children: TokenUsage
    run_key: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, run_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., project_id: _Optional[str] = ..., release_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., output_json: _Optional[str] = ..., output_ref: _Optional[str] = ..., input_ref: _Optional[str] = ..., depth: _Optional[int] = ..., parent_run_id: _Optional[str] = ..., created_at: _Optional[str] = ..., ended_at: _Optional[str] = ..., cancel_requested: _Optional[bool] = ..., max_attempts: _Optional[int] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., hold: _Optional[_Union[Hold, _Mapping]] = ..., purged: _Optional[str] = ..., rerun_of: _Optional[_Union[RerunOrigin, _Mapping]] = ..., rerun_ids: _Optional[_Iterable[str]] = ..., tokens: _Optional[_Union[TokenUsage, _Mapping]] = ..., tokens_with_children: _Optional[_Union[TokenUsage, _Mapping]] = ..., run_key: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SubmitRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id", "tenant_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant_id: str
    def __init__(self, run_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("state", "agent_id", "release_id", "project_id", "page_size", "page_after", "tenant_id", "submitted_from", "submitted_until", "reason_contains", "label", "waiting")
    STATE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_AFTER_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FROM_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    REASON_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    state: str
    agent_id: str
    release_id: str
    project_id: str
    page_size: int
    page_after: str
    tenant_id: str
    submitted_from: str
    submitted_until: str
    reason_contains: str
    label: str
    waiting: str
    def __init__(self, state: _Optional[str] = ..., agent_id: _Optional[str] = ..., release_id: _Optional[str] = ..., project_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_after: _Optional[str] = ..., tenant_id: _Optional[str] = ..., submitted_from: _Optional[str] = ..., submitted_until: _Optional[str] = ..., reason_contains: _Optional[str] = ..., label: _Optional[str] = ..., waiting: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_after")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_AFTER_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_after: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_after: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason", "tenant_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    tenant_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "approve", "reason", "decision_id", "tenant_id", "arguments_json", "respond")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESPOND_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approve: bool
    reason: str
    decision_id: str
    tenant_id: str
    arguments_json: str
    respond: bool
    def __init__(self, approval_id: _Optional[str] = ..., approve: _Optional[bool] = ..., reason: _Optional[str] = ..., decision_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., arguments_json: _Optional[str] = ..., respond: _Optional[bool] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("attempt",)
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    attempt: Attempt
    def __init__(self, attempt: _Optional[_Union[Attempt, _Mapping]] = ...) -> None: ...

class SettleCallRequest(_message.Message):
    __slots__ = ("attempt_id", "call_id", "effect", "reason", "retry", "tenant_id")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    call_id: str
    effect: str
    reason: str
    retry: bool
    tenant_id: str
    def __init__(self, attempt_id: _Optional[str] = ..., call_id: _Optional[str] = ..., effect: _Optional[str] = ..., reason: _Optional[str] = ..., retry: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class SettleCallResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...
