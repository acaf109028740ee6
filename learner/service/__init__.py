"""The gRPC service actors talk to: identity, admission, leases and pacing, the group queue, accounting."""
