"""Shared-token authentication for tandem's gRPC servers (the learner's, and each actor's weight relay).

Every RPC must carry the metadata `authorization: Bearer <token>`; anything else is answered
UNAUTHENTICATED before the servicer runs. The server decodes header bytes as UTF-8 or Latin-1, so the
presented value may be any text: it is compared as bytes, and only when its length is the token's.
"""

from __future__ import annotations

import hmac

import grpc

AUTH_METADATA_KEY = "authorization"


def bearer(token: str) -> str:
    return f"Bearer {token}"


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose `authorization` metadata is not `Bearer <token>`."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must be non-empty")
        self._expected = bearer(token).encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        presented = dict(handler_call_details.invocation_metadata or ()).get(AUTH_METADATA_KEY, "")
        if self.accepts(presented):
            return handler
        return _refusing_like(handler)

    def accepts(self, presented: object) -> bool:
        """Whether `presented` is `Bearer <token>`; False, never an exception, for any value."""
        if isinstance(presented, str):
            if len(presented) > len(self._expected):  # bounded work for an over-long header
                return False
            presented = presented.encode("utf-8", "surrogatepass")
        if not isinstance(presented, bytes):
            return False
        return hmac.compare_digest(presented, self._expected)


def _refusing_like(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that aborts with UNAUTHENTICATED."""

    def refuse(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

    options = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **options)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **options)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **options)
    return grpc.unary_unary_rpc_method_handler(refuse, **options)
