"""tandem's wire contract: Python generated from proto/tandem_wire/tandem.proto, plus the channel
settings both ends must agree on. What both ends share of the weight path is in tandem_wire/weights/.

The generated modules (`tandem_pb2`, `tandem_pb2_grpc`) are committed; `make proto` regenerates
them and CI fails if they drift. This package is named `tandem_wire`, not `proto`, because
`proto` is proto-plus's import name (installed by ray[default]).
"""

from tandem_wire import tandem_pb2 as pb
from tandem_wire import tandem_pb2_grpc as rpc

WIRE_VERSION = pb.WIRE_VERSION_2

# gRPC's 4 MiB default is too small for weight chunks; both ends set this explicitly.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def grpc_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Channel/server options used by every tandem gRPC endpoint."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


__all__ = ["pb", "rpc", "WIRE_VERSION", "MAX_MESSAGE_BYTES", "grpc_options"]
