from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WireVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIRE_VERSION_UNSPECIFIED: _ClassVar[WireVersion]
    WIRE_VERSION_1: _ClassVar[WireVersion]
    WIRE_VERSION_2: _ClassVar[WireVersion]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATUS_UNSPECIFIED: _ClassVar[AckStatus]
    ACK_STATUS_QUEUED: _ClassVar[AckStatus]
    ACK_STATUS_CONSUMED: _ClassVar[AckStatus]
    ACK_STATUS_DUPLICATE: _ClassVar[AckStatus]
    ACK_STATUS_STALE: _ClassVar[AckStatus]
    ACK_STATUS_INVALID: _ClassVar[AckStatus]
    ACK_STATUS_RETRY: _ClassVar[AckStatus]

class WeightKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_KIND_UNSPECIFIED: _ClassVar[WeightKind]
    WEIGHT_KIND_FULL: _ClassVar[WeightKind]
    WEIGHT_KIND_ADAPTER: _ClassVar[WeightKind]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
WIRE_VERSION_UNSPECIFIED: WireVersion
WIRE_VERSION_1: WireVersion
WIRE_VERSION_2: WireVersion
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
ACK_STATUS_UNSPECIFIED: AckStatus
ACK_STATUS_QUEUED: AckStatus
ACK_STATUS_CONSUMED: AckStatus
ACK_STATUS_DUPLICATE: AckStatus
ACK_STATUS_STALE: AckStatus
ACK_STATUS_INVALID: AckStatus
ACK_STATUS_RETRY: AckStatus
WEIGHT_KIND_UNSPECIFIED: WeightKind
WEIGHT_KIND_FULL: WeightKind
WEIGHT_KIND_ADAPTER: WeightKind
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_BFLOAT16: DType
DTYPE_FLOAT16: DType

class Turn(_message.Message):
    __slots__ = ("sampled_tokens", "observation_tokens", "policy_version", "reward", "context_token_ids")
    SAMPLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    sampled_tokens: int
    observation_tokens: int
    policy_version: int
    reward: float
    context_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sampled_tokens: _Optional[int] = ..., observation_tokens: _Optional[int] = ..., policy_version: _Optional[int] = ..., reward: _Optional[float] = ..., context_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("token_ids", "logprobs", "finish_reason", "reward", "unscorable_reason", "text", "turns", "token_versions")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    UNSCORABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    reward: float
    unscorable_reason: str
    text: str
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    token_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., reward: _Optional[float] = ..., unscorable_reason: _Optional[str] = ..., text: _Optional[str] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., token_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("sample_seconds", "score_seconds", "sampled_at")
    SAMPLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    sample_seconds: float
    score_seconds: float
    sampled_at: float
    def __init__(self, sample_seconds: _Optional[float] = ..., score_seconds: _Optional[float] = ..., sampled_at: _Optional[float] = ...) -> None: ...

class ScoredGroup(_message.Message):
    __slots__ = ("wire_version", "group_id", "actor_id", "policy_version", "prompt_token_ids", "completions", "timings", "metadata", "rejected_reason")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REJECTED_REASON_FIELD_NUMBER: _ClassVar[int]
    wire_version: WireVersion
    group_id: str
    actor_id: str
    policy_version: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    timings: Timings
    metadata: _containers.ScalarMap[str, str]
    rejected_reason: str
    def __init__(self, wire_version: _Optional[_Union[WireVersion, str]] = ..., group_id: _Optional[str] = ..., actor_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., rejected_reason: _Optional[str] = ...) -> None: ...

class GroupAck(_message.Message):
    __slots__ = ("group_id", "status", "detail", "credits", "latest_version")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    status: AckStatus
    detail: str
    credits: int
    latest_version: int
    def __init__(self, group_id: _Optional[str] = ..., status: _Optional[_Union[AckStatus, str]] = ..., detail: _Optional[str] = ..., credits: _Optional[int] = ..., latest_version: _Optional[int] = ...) -> None: ...

class ActorCapabilities(_message.Message):
    __slots__ = ("engine", "model_family", "max_model_len", "group_size", "host", "max_prompt_tokens")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FAMILY_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    model_family: str
    max_model_len: int
    group_size: int
    host: str
    max_prompt_tokens: int
    def __init__(self, engine: _Optional[str] = ..., model_family: _Optional[str] = ..., max_model_len: _Optional[int] = ..., group_size: _Optional[int] = ..., host: _Optional[str] = ..., max_prompt_tokens: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("wire_version", "actor_id", "capabilities", "weight_version")
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    wire_version: WireVersion
    actor_id: str
    capabilities: ActorCapabilities
    weight_version: int
    def __init__(self, wire_version: _Optional[_Union[WireVersion, str]] = ..., actor_id: _Optional[str] = ..., capabilities: _Optional[_Union[ActorCapabilities, _Mapping]] = ..., weight_version: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("latest_version", "heartbeat_interval_ms", "credits", "max_staleness", "credential")
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    latest_version: int
    heartbeat_interval_ms: int
    credits: int
    max_staleness: int
    credential: str
    def __init__(self, latest_version: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., credits: _Optional[int] = ..., max_staleness: _Optional[int] = ..., credential: _Optional[str] = ...) -> None: ...

class TimeShares(_message.Message):
    __slots__ = ("busy", "lease_wait", "credit_wait", "weight_stall")
    BUSY_FIELD_NUMBER: _ClassVar[int]
    LEASE_WAIT_FIELD_NUMBER: _ClassVar[int]
    CREDIT_WAIT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_STALL_FIELD_NUMBER: _ClassVar[int]
    busy: float
    lease_wait: float
    credit_wait: float
    weight_stall: float
    def __init__(self, busy: _Optional[float] = ..., lease_wait: _Optional[float] = ..., credit_wait: _Optional[float] = ..., weight_stall: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("wire_version", "actor_id", "weight_version", "groups_in_flight", "tokens_per_second", "time_shares")
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TIME_SHARES_FIELD_NUMBER: _ClassVar[int]
    wire_version: WireVersion
    actor_id: str
    weight_version: int
    groups_in_flight: int
    tokens_per_second: float
    time_shares: TimeShares
    def __init__(self, wire_version: _Optional[_Union[WireVersion, str]] = ..., actor_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., groups_in_flight: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., time_shares: _Optional[_Union[TimeShares, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("latest_version",)
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    latest_version: int
    def __init__(self, latest_version: _Optional[int] = ...) -> None: ...

class LeasePromptsRequest(_message.Message):
    __slots__ = ("wire_version", "actor_id", "max_prompts")
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    wire_version: WireVersion
    actor_id: str
    max_prompts: int
    def __init__(self, wire_version: _Optional[_Union[WireVersion, str]] = ..., actor_id: _Optional[str] = ..., max_prompts: _Optional[int] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("group_id", "token_ids", "text", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, group_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LeasePromptsReply(_message.Message):
    __slots__ = ("prompts", "exhausted", "lease_seconds", "retry_after_seconds", "latest_version")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    exhausted: bool
    lease_seconds: float
    retry_after_seconds: float
    latest_version: int
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., exhausted: _Optional[bool] = ..., lease_seconds: _Optional[float] = ..., retry_after_seconds: _Optional[float] = ..., latest_version: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class WeightHeader(_message.Message):
    __slots__ = ("version", "tensors", "total_bytes", "checksum_algorithm", "kind", "adapter_config")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CONFIG_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    checksum_algorithm: str
    kind: WeightKind
    adapter_config: str
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., checksum_algorithm: _Optional[str] = ..., kind: _Optional[_Union[WeightKind, str]] = ..., adapter_config: _Optional[str] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "offset", "data")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    offset: int
    data: bytes
    def __init__(self, version: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WeightCommit(_message.Message):
    __slots__ = ("version", "checksum", "total_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    checksum: str
    total_bytes: int
    def __init__(self, version: _Optional[int] = ..., checksum: _Optional[str] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class SharedWeights(_message.Message):
    __slots__ = ("version", "path", "total_bytes", "checksum_algorithm", "checksum")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    version: int
    path: str
    total_bytes: int
    checksum_algorithm: str
    checksum: str
    def __init__(self, version: _Optional[int] = ..., path: _Optional[str] = ..., total_bytes: _Optional[int] = ..., checksum_algorithm: _Optional[str] = ..., checksum: _Optional[str] = ...) -> None: ...

class PeerWeights(_message.Message):
    __slots__ = ("version", "address", "actor_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    address: str
    actor_id: str
    def __init__(self, version: _Optional[int] = ..., address: _Optional[str] = ..., actor_id: _Optional[str] = ...) -> None: ...

class WeightMessage(_message.Message):
    __slots__ = ("header", "chunk", "commit", "shared", "peer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    header: WeightHeader
    chunk: WeightChunk
    commit: WeightCommit
    shared: SharedWeights
    peer: PeerWeights
    def __init__(self, header: _Optional[_Union[WeightHeader, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ..., commit: _Optional[_Union[WeightCommit, _Mapping]] = ..., shared: _Optional[_Union[SharedWeights, _Mapping]] = ..., peer: _Optional[_Union[PeerWeights, _Mapping]] = ...) -> None: ...

class FetchWeightsRequest(_message.Message):
    __slots__ = ("wire_version", "actor_id", "version", "shared_memory_domain", "relay_address")
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    RELAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    wire_version: WireVersion
    actor_id: str
    version: int
    shared_memory_domain: str
    relay_address: str
    def __init__(self, wire_version: _Optional[_Union[WireVersion, str]] = ..., actor_id: _Optional[str] = ..., version: _Optional[int] = ..., shared_memory_domain: _Optional[str] = ..., relay_address: _Optional[str] = ...) -> None: ...

class WeightReport(_message.Message):
    __slots__ = ("actor_id", "version", "applied", "detail", "stall_seconds", "transfer_seconds")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    version: int
    applied: bool
    detail: str
    stall_seconds: float
    transfer_seconds: float
    def __init__(self, actor_id: _Optional[str] = ..., version: _Optional[int] = ..., applied: _Optional[bool] = ..., detail: _Optional[str] = ..., stall_seconds: _Optional[float] = ..., transfer_seconds: _Optional[float] = ...) -> None: ...

class WeightReportReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ActorStatus(_message.Message):
    __slots__ = ("actor_id", "weight_version", "seconds_since_heartbeat", "groups_in_flight", "tokens_per_second", "time_shares")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TIME_SHARES_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    weight_version: int
    seconds_since_heartbeat: float
    groups_in_flight: int
    tokens_per_second: float
    time_shares: TimeShares
    def __init__(self, actor_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., seconds_since_heartbeat: _Optional[float] = ..., groups_in_flight: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., time_shares: _Optional[_Union[TimeShares, _Mapping]] = ...) -> None: ...

class Accounting(_message.Message):
    __slots__ = ("prompts_leased", "prompts_reissued", "groups_received", "groups_queued", "groups_consumed", "groups_duplicate", "groups_stale", "groups_invalid", "groups_retry", "completions_unscorable", "prompts_too_long", "groups_stale_on_arrival", "groups_stale_at_dequeue", "groups_in_queue", "groups_in_batch", "groups_forgotten_on_restart", "prompts_retired", "prompts_outstanding", "internal_errors", "lease_violations", "requests_invalid", "credentials_refused", "weight_reports_refused", "calls_refused_busy", "streams_idle_closed", "actors_superseded", "lease_slots_in_use", "tokens_received", "tokens_queued", "tokens_duplicate", "tokens_stale_on_arrival", "tokens_invalid", "tokens_retry", "tokens_trained", "tokens_no_signal", "tokens_stale_at_dequeue", "tokens_forgotten_on_restart", "tokens_in_queue", "tokens_in_batch", "weight_bytes_streamed", "weight_bytes_shared", "weight_fetches_relayed")
    PROMPTS_LEASED_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_REISSUED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_STALE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_INVALID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_RETRY_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_UNSCORABLE_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_TOO_LONG_FIELD_NUMBER: _ClassVar[int]
    GROUPS_STALE_ON_ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    GROUPS_STALE_AT_DEQUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_QUEUE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_BATCH_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FORGOTTEN_ON_RESTART_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_RETIRED_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    LEASE_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_INVALID_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_REPORTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    CALLS_REFUSED_BUSY_FIELD_NUMBER: _ClassVar[int]
    STREAMS_IDLE_CLOSED_FIELD_NUMBER: _ClassVar[int]
    ACTORS_SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    LEASE_SLOTS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_STALE_ON_ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INVALID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_RETRY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_NO_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_STALE_AT_DEQUEUE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FORGOTTEN_ON_RESTART_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_QUEUE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_BATCH_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_STREAMED_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_SHARED_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FETCHES_RELAYED_FIELD_NUMBER: _ClassVar[int]
    prompts_leased: int
    prompts_reissued: int
    groups_received: int
    groups_queued: int
    groups_consumed: int
    groups_duplicate: int
    groups_stale: int
    groups_invalid: int
    groups_retry: int
    completions_unscorable: int
    prompts_too_long: int
    groups_stale_on_arrival: int
    groups_stale_at_dequeue: int
    groups_in_queue: int
    groups_in_batch: int
    groups_forgotten_on_restart: int
    prompts_retired: int
    prompts_outstanding: int
    internal_errors: int
    lease_violations: int
    requests_invalid: int
    credentials_refused: int
    weight_reports_refused: int
    calls_refused_busy: int
    streams_idle_closed: int
    actors_superseded: int
    lease_slots_in_use: int
    tokens_received: int
    tokens_queued: int
    tokens_duplicate: int
    tokens_stale_on_arrival: int
    tokens_invalid: int
    tokens_retry: int
    tokens_trained: int
    tokens_no_signal: int
    tokens_stale_at_dequeue: int
    tokens_forgotten_on_restart: int
    tokens_in_queue: int
    tokens_in_batch: int
    weight_bytes_streamed: int
    weight_bytes_shared: int
    weight_fetches_relayed: int
    def __init__(self, prompts_leased: _Optional[int] = ..., prompts_reissued: _Optional[int] = ..., groups_received: _Optional[int] = ..., groups_queued: _Optional[int] = ..., groups_consumed: _Optional[int] = ..., groups_duplicate: _Optional[int] = ..., groups_stale: _Optional[int] = ..., groups_invalid: _Optional[int] = ..., groups_retry: _Optional[int] = ..., completions_unscorable: _Optional[int] = ..., prompts_too_long: _Optional[int] = ..., groups_stale_on_arrival: _Optional[int] = ..., groups_stale_at_dequeue: _Optional[int] = ..., groups_in_queue: _Optional[int] = ..., groups_in_batch: _Optional[int] = ..., groups_forgotten_on_restart: _Optional[int] = ..., prompts_retired: _Optional[int] = ..., prompts_outstanding: _Optional[int] = ..., internal_errors: _Optional[int] = ..., lease_violations: _Optional[int] = ..., requests_invalid: _Optional[int] = ..., credentials_refused: _Optional[int] = ..., weight_reports_refused: _Optional[int] = ..., calls_refused_busy: _Optional[int] = ..., streams_idle_closed: _Optional[int] = ..., actors_superseded: _Optional[int] = ..., lease_slots_in_use: _Optional[int] = ..., tokens_received: _Optional[int] = ..., tokens_queued: _Optional[int] = ..., tokens_duplicate: _Optional[int] = ..., tokens_stale_on_arrival: _Optional[int] = ..., tokens_invalid: _Optional[int] = ..., tokens_retry: _Optional[int] = ..., tokens_trained: _Optional[int] = ..., tokens_no_signal: _Optional[int] = ..., tokens_stale_at_dequeue: _Optional[int] = ..., tokens_forgotten_on_restart: _Optional[int] = ..., tokens_in_queue: _Optional[int] = ..., tokens_in_batch: _Optional[int] = ..., weight_bytes_streamed: _Optional[int] = ..., weight_bytes_shared: _Optional[int] = ..., weight_fetches_relayed: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("step", "weight_version", "queue_depth", "queue_capacity", "actors", "accounting", "mode")
    STEP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    step: int
    weight_version: int
    queue_depth: int
    queue_capacity: int
    actors: _containers.RepeatedCompositeFieldContainer[ActorStatus]
    accounting: Accounting
    mode: str
    def __init__(self, step: _Optional[int] = ..., weight_version: _Optional[int] = ..., queue_depth: _Optional[int] = ..., queue_capacity: _Optional[int] = ..., actors: _Optional[_Iterable[_Union[ActorStatus, _Mapping]]] = ..., accounting: _Optional[_Union[Accounting, _Mapping]] = ..., mode: _Optional[str] = ...) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("wire_version", "version")
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    wire_version: WireVersion
    version: int
    def __init__(self, wire_version: _Optional[_Union[WireVersion, str]] = ..., version: _Optional[int] = ...) -> None: ...
