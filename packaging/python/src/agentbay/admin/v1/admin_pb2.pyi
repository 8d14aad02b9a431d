from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetVersionResponse(_message.Message):
    __slots__ = ("version", "schema_version", "certificate_fingerprint", "caller_tenant_id", "caller_scopes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CALLER_TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_SCOPES_FIELD_NUMBER: _ClassVar[int]
    version: str
    schema_version: int
    certificate_fingerprint: str
    caller_tenant_id: str
    caller_scopes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., schema_version: _Optional[int] = ..., certificate_fingerprint: _Optional[str] = ..., caller_tenant_id: _Optional[str] = ..., caller_scopes: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateClientRequest(_message.Message):
    __slots__ = ("tenant_id", "scopes", "description")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, tenant_id: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class CreateClientResponse(_message.Message):
    __slots__ = ("client", "client_secret")
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SECRET_FIELD_NUMBER: _ClassVar[int]
    client: Client
    client_secret: str
    def __init__(self, client: _Optional[_Union[Client, _Mapping]] = ..., client_secret: _Optional[str] = ...) -> None: ...

class ListClientsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClientsResponse(_message.Message):
    __slots__ = ("clients",)
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    clients: _containers.RepeatedCompositeFieldContainer[Client]
    def __init__(self, clients: _Optional[_Iterable[_Union[Client, _Mapping]]] = ...) -> None: ...

class RevokeClientRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    def __init__(self, client_id: _Optional[str] = ...) -> None: ...

class RevokeClientResponse(_message.Message):
    __slots__ = ("client",)
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    client: Client
    def __init__(self, client: _Optional[_Union[Client, _Mapping]] = ...) -> None: ...

class Client(_message.Message):
    __slots__ = ("client_id", "tenant_id", "scopes", "description", "created_at", "revoked_at")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    tenant_id: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    description: str
    created_at: str
    revoked_at: str
    def __init__(self, client_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ..., created_at: _Optional[str] = ..., revoked_at: _Optional[str] = ...) -> None: ...

class CreateUserRequest(_message.Message):
    __slots__ = ("tenant_id", "username", "display_name", "roles", "password", "email")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    EMAIL_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    username: str
    display_name: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    password: str
    email: str
    def __init__(self, tenant_id: _Optional[str] = ..., username: _Optional[str] = ..., display_name: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., password: _Optional[str] = ..., email: _Optional[str] = ...) -> None: ...

class CreateUserResponse(_message.Message):
    __slots__ = ("user", "generated_password")
    USER_FIELD_NUMBER: _ClassVar[int]
    GENERATED_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    user: User
    generated_password: str
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., generated_password: _Optional[str] = ...) -> None: ...

class ListUsersRequest(_message.Message):
    __slots__ = ("tenant_id",)
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class ListUsersResponse(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class DisableUserRequest(_message.Message):
    __slots__ = ("tenant_id", "username")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    username: str
    def __init__(self, tenant_id: _Optional[str] = ..., username: _Optional[str] = ...) -> None: ...

class DisableUserResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class EnableUserRequest(_message.Message):
    __slots__ = ("tenant_id", "username")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    username: str
    def __init__(self, tenant_id: _Optional[str] = ..., username: _Optional[str] = ...) -> None: ...

class EnableUserResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class ResetUserPasswordRequest(_message.Message):
    __slots__ = ("tenant_id", "username", "password")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    username: str
    password: str
    def __init__(self, tenant_id: _Optional[str] = ..., username: _Optional[str] = ..., password: _Optional[str] = ...) -> None: ...

class ResetUserPasswordResponse(_message.Message):
    __slots__ = ("user", "generated_password")
    USER_FIELD_NUMBER: _ClassVar[int]
    GENERATED_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    user: User
    generated_password: str
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., generated_password: _Optional[str] = ...) -> None: ...

class SetUserEmailRequest(_message.Message):
    __slots__ = ("tenant_id", "username", "email")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    EMAIL_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    username: str
    email: str
    def __init__(self, tenant_id: _Optional[str] = ..., username: _Optional[str] = ..., email: _Optional[str] = ...) -> None: ...

class SetUserEmailResponse(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: User
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("username", "tenant_id", "roles", "display_name", "created_at", "created_by", "disabled_at", "email")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    DISABLED_AT_FIELD_NUMBER: _ClassVar[int]
    EMAIL_FIELD_NUMBER: _ClassVar[int]
    username: str
    tenant_id: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    display_name: str
    created_at: str
    created_by: str
    disabled_at: str
    email: str
    def __init__(self, username: _Optional[str] = ..., tenant_id: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., display_name: _Optional[str] = ..., created_at: _Optional[str] = ..., created_by: _Optional[str] = ..., disabled_at: _Optional[str] = ..., email: _Optional[str] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("after_sequence", "topics", "until_sequence")
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    topics: _containers.RepeatedScalarFieldContainer[str]
    until_sequence: int
    def __init__(self, after_sequence: _Optional[int] = ..., topics: _Optional[_Iterable[str]] = ..., until_sequence: _Optional[int] = ...) -> None: ...

class GetEventsHeadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetEventsHeadResponse(_message.Message):
    __slots__ = ("sequence",)
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    def __init__(self, sequence: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("sequence", "topic", "tenant_id", "occurred_at", "payload")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    topic: str
    tenant_id: str
    occurred_at: str
    payload: _struct_pb2.Struct
    def __init__(self, sequence: _Optional[int] = ..., topic: _Optional[str] = ..., tenant_id: _Optional[str] = ..., occurred_at: _Optional[str] = ..., payload: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("tenant_id", "display_name", "edition", "residency_regions", "created_at", "updated_at", "payload_retention_days", "history_retention_days")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    EDITION_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_REGIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    display_name: str
    edition: str
    residency_regions: _containers.RepeatedScalarFieldContainer[str]
    created_at: str
    updated_at: str
    payload_retention_days: int
    history_retention_days: int
    def __init__(self, tenant_id: _Optional[str] = ..., display_name: _Optional[str] = ..., edition: _Optional[str] = ..., residency_regions: _Optional[_Iterable[str]] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., payload_retention_days: _Optional[int] = ..., history_retention_days: _Optional[int] = ...) -> None: ...

class PutTenantRequest(_message.Message):
    __slots__ = ("tenant_id", "display_name", "edition", "residency_regions", "payload_retention_days", "history_retention_days")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    EDITION_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_REGIONS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_RETENTION_DAYS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    display_name: str
    edition: str
    residency_regions: _containers.RepeatedScalarFieldContainer[str]
    payload_retention_days: int
    history_retention_days: int
    def __init__(self, tenant_id: _Optional[str] = ..., display_name: _Optional[str] = ..., edition: _Optional[str] = ..., residency_regions: _Optional[_Iterable[str]] = ..., payload_retention_days: _Optional[int] = ..., history_retention_days: _Optional[int] = ...) -> None: ...

class PutTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ...) -> None: ...

class PutProjectRequest(_message.Message):
    __slots__ = ("tenant_id", "project_id", "display_name")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    project_id: str
    display_name: str
    def __init__(self, tenant_id: _Optional[str] = ..., project_id: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class PutProjectResponse(_message.Message):
    __slots__ = ("tenant_id", "project_id", "display_name")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    project_id: str
    display_name: str
    def __init__(self, tenant_id: _Optional[str] = ..., project_id: _Optional[str] = ..., display_name: _Optional[str] = ...) -> None: ...

class RunWorkerRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RunWorkerResponse(_message.Message):
    __slots__ = ("name", "ok", "message", "runs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ok: bool
    message: str
    runs: int
    def __init__(self, name: _Optional[str] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ..., runs: _Optional[int] = ...) -> None: ...

class AdvanceClockRequest(_message.Message):
    __slots__ = ("seconds",)
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    seconds: int
    def __init__(self, seconds: _Optional[int] = ...) -> None: ...

class AdvanceClockResponse(_message.Message):
    __slots__ = ("now",)
    NOW_FIELD_NUMBER: _ClassVar[int]
    now: str
    def __init__(self, now: _Optional[str] = ...) -> None: ...

class PublisherKey(_message.Message):
    __slots__ = ("key_id", "name", "public_key", "tenants", "state", "source", "trusted_at", "trusted_by", "revoked_at", "revoked_by", "revoke_reason", "demo")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKE_REASON_FIELD_NUMBER: _ClassVar[int]
    DEMO_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    name: str
    public_key: str
    tenants: _containers.RepeatedScalarFieldContainer[str]
    state: str
    source: str
    trusted_at: str
    trusted_by: str
    revoked_at: str
    revoked_by: str
    revoke_reason: str
    demo: bool
    def __init__(self, key_id: _Optional[str] = ..., name: _Optional[str] = ..., public_key: _Optional[str] = ..., tenants: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., source: _Optional[str] = ..., trusted_at: _Optional[str] = ..., trusted_by: _Optional[str] = ..., revoked_at: _Optional[str] = ..., revoked_by: _Optional[str] = ..., revoke_reason: _Optional[str] = ..., demo: _Optional[bool] = ...) -> None: ...

class Reverified(_message.Message):
    __slots__ = ("verified", "untrusted", "rejected", "changed", "failed")
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    UNTRUSTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    verified: int
    untrusted: int
    rejected: int
    changed: int
    failed: int
    def __init__(self, verified: _Optional[int] = ..., untrusted: _Optional[int] = ..., rejected: _Optional[int] = ..., changed: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class TrustPublisherKeyRequest(_message.Message):
    __slots__ = ("name", "public_key", "tenants", "replace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    public_key: str
    tenants: _containers.RepeatedScalarFieldContainer[str]
    replace: bool
    def __init__(self, name: _Optional[str] = ..., public_key: _Optional[str] = ..., tenants: _Optional[_Iterable[str]] = ..., replace: _Optional[bool] = ...) -> None: ...

class TrustPublisherKeyResponse(_message.Message):
    __slots__ = ("key", "reverified", "change")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REVERIFIED_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    key: PublisherKey
    reverified: Reverified
    change: str
    def __init__(self, key: _Optional[_Union[PublisherKey, _Mapping]] = ..., reverified: _Optional[_Union[Reverified, _Mapping]] = ..., change: _Optional[str] = ...) -> None: ...

class ListPublisherKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPublisherKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[PublisherKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[PublisherKey, _Mapping]]] = ...) -> None: ...

class RevokePublisherKeyRequest(_message.Message):
    __slots__ = ("key_id", "reason")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    reason: str
    def __init__(self, key_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokePublisherKeyResponse(_message.Message):
    __slots__ = ("key", "reverified")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REVERIFIED_FIELD_NUMBER: _ClassVar[int]
    key: PublisherKey
    reverified: Reverified
    def __init__(self, key: _Optional[_Union[PublisherKey, _Mapping]] = ..., reverified: _Optional[_Union[Reverified, _Mapping]] = ...) -> None: ...

class ModelProfile(_message.Message):
    __slots__ = ("profile_id", "tenant_id", "endpoint", "model", "api_key_ref", "timeout_seconds", "updated_at", "updated_by", "fallback_endpoints", "max_concurrent", "requests_per_minute", "tokens_per_minute")
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_REF_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    profile_id: str
    tenant_id: str
    endpoint: str
    model: str
    api_key_ref: str
    timeout_seconds: int
    updated_at: str
    updated_by: str
    fallback_endpoints: _containers.RepeatedScalarFieldContainer[str]
    max_concurrent: int
    requests_per_minute: int
    tokens_per_minute: int
    def __init__(self, profile_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., model: _Optional[str] = ..., api_key_ref: _Optional[str] = ..., timeout_seconds: _Optional[int] = ..., updated_at: _Optional[str] = ..., updated_by: _Optional[str] = ..., fallback_endpoints: _Optional[_Iterable[str]] = ..., max_concurrent: _Optional[int] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ...) -> None: ...

class PutModelProfileRequest(_message.Message):
    __slots__ = ("profile_id", "tenant_id", "endpoint", "model", "api_key_ref", "timeout_seconds", "fallback_endpoints", "max_concurrent", "requests_per_minute", "tokens_per_minute")
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_REF_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    profile_id: str
    tenant_id: str
    endpoint: str
    model: str
    api_key_ref: str
    timeout_seconds: int
    fallback_endpoints: _containers.RepeatedScalarFieldContainer[str]
    max_concurrent: int
    requests_per_minute: int
    tokens_per_minute: int
    def __init__(self, profile_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., model: _Optional[str] = ..., api_key_ref: _Optional[str] = ..., timeout_seconds: _Optional[int] = ..., fallback_endpoints: _Optional[_Iterable[str]] = ..., max_concurrent: _Optional[int] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ...) -> None: ...

class PutModelProfileResponse(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: ModelProfile
    def __init__(self, profile: _Optional[_Union[ModelProfile, _Mapping]] = ...) -> None: ...

class ListModelProfilesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelProfilesResponse(_message.Message):
    __slots__ = ("profiles",)
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ModelProfile]
    def __init__(self, profiles: _Optional[_Iterable[_Union[ModelProfile, _Mapping]]] = ...) -> None: ...

class DeleteModelProfileRequest(_message.Message):
    __slots__ = ("profile_id", "tenant_id")
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    profile_id: str
    tenant_id: str
    def __init__(self, profile_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class DeleteModelProfileResponse(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: ModelProfile
    def __init__(self, profile: _Optional[_Union[ModelProfile, _Mapping]] = ...) -> None: ...

class ReloadConfigurationRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadConfigurationResponse(_message.Message):
    __slots__ = ("applied", "restart_needed", "loaded_at", "loaded_from")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    RESTART_NEEDED_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    LOADED_FROM_FIELD_NUMBER: _ClassVar[int]
    applied: _containers.RepeatedScalarFieldContainer[str]
    restart_needed: _containers.RepeatedScalarFieldContainer[str]
    loaded_at: str
    loaded_from: str
    def __init__(self, applied: _Optional[_Iterable[str]] = ..., restart_needed: _Optional[_Iterable[str]] = ..., loaded_at: _Optional[str] = ..., loaded_from: _Optional[str] = ...) -> None: ...
