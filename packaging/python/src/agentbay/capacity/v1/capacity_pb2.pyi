from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    REQUESTED: _ClassVar[LeaseState]
    GRANTED: _ClassVar[LeaseState]
    ACTIVE: _ClassVar[LeaseState]
    RELEASED: _ClassVar[LeaseState]
    EXPIRED: _ClassVar[LeaseState]
    DENIED: _ClassVar[LeaseState]
LEASE_STATE_UNSPECIFIED: LeaseState
REQUESTED: LeaseState
GRANTED: LeaseState
ACTIVE: LeaseState
RELEASED: LeaseState
EXPIRED: LeaseState
DENIED: LeaseState

class AcquireLeaseRequest(_message.Message):
    __slots__ = ("tenant_id", "project_id", "holder_kind", "holder_id", "run_id", "attempt_id", "cpu", "memory_gb", "pool_id", "internet_egress", "wait", "wait_seconds")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KIND_FIELD_NUMBER: _ClassVar[int]
    HOLDER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    INTERNET_EGRESS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    project_id: str
    holder_kind: str
    holder_id: str
    run_id: str
    attempt_id: str
    cpu: float
    memory_gb: float
    pool_id: str
    internet_egress: bool
    wait: bool
    wait_seconds: int
    def __init__(self, tenant_id: _Optional[str] = ..., project_id: _Optional[str] = ..., holder_kind: _Optional[str] = ..., holder_id: _Optional[str] = ..., run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., cpu: _Optional[float] = ..., memory_gb: _Optional[float] = ..., pool_id: _Optional[str] = ..., internet_egress: _Optional[bool] = ..., wait: _Optional[bool] = ..., wait_seconds: _Optional[int] = ...) -> None: ...

class AcquireLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "tenant_id", "project_id", "run_id", "attempt_id", "holder_kind", "holder_id", "pool_id", "cpu", "memory_gb", "state", "requested_at", "granted_at", "expires_at", "released_at", "reason", "queue_position", "execution_seconds", "limiting_quota")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KIND_FIELD_NUMBER: _ClassVar[int]
    HOLDER_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMITING_QUOTA_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    tenant_id: str
    project_id: str
    run_id: str
    attempt_id: str
    holder_kind: str
    holder_id: str
    pool_id: str
    cpu: float
    memory_gb: float
    state: LeaseState
    requested_at: str
    granted_at: str
    expires_at: str
    released_at: str
    reason: str
    queue_position: int
    execution_seconds: int
    limiting_quota: str
    def __init__(self, lease_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., holder_kind: _Optional[str] = ..., holder_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., cpu: _Optional[float] = ..., memory_gb: _Optional[float] = ..., state: _Optional[_Union[LeaseState, str]] = ..., requested_at: _Optional[str] = ..., granted_at: _Optional[str] = ..., expires_at: _Optional[str] = ..., released_at: _Optional[str] = ..., reason: _Optional[str] = ..., queue_position: _Optional[int] = ..., execution_seconds: _Optional[int] = ..., limiting_quota: _Optional[str] = ...) -> None: ...
