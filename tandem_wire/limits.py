"""The documented bounds on what an actor may send the learner (docs/security.md).

The learner checks every field at the door and refuses a message that exceeds a bound (an INVALID
ack for a group, INVALID_ARGUMENT for a call); the actor-side client keeps its own free-text
fields within them. Both ends import these numbers, so they cannot drift apart.
"""

# Identifiers: actor_id, group_id. Printable characters only (they reach logs and acks).
MAX_ID_CHARS = 128
# Capability labels: engine, model_family, host. Printable characters only.
MAX_LABEL_CHARS = 256
# Free text from the actor: WeightReport.detail, Completion.unscorable_reason, rejected_reason.
MAX_DETAIL_CHARS = 1024
# One completion's decoded text.
MAX_TEXT_CHARS = 1 << 20
# ScoredGroup.metadata (echoed from the leased prompt).
MAX_METADATA_ENTRIES = 256
MAX_METADATA_KEY_CHARS = 256
MAX_METADATA_VALUE_CHARS = 1 << 20
# ActorCapabilities.group_size, and completions in one group when the learner fixes no group size.
MAX_GROUP_SIZE = 4096
# Turns in one multi-turn completion (Completion.turns).
MAX_TURNS = 1024
# ActorCapabilities.max_model_len (and so max_prompt_tokens, which must be below it).
MAX_MODEL_LEN = 1 << 24
# HeartbeatRequest.groups_in_flight.
MAX_GROUPS_IN_FLIGHT = 1 << 20
# What an ack echoes: the group id up to MAX_ID_CHARS, the detail up to this.
MAX_ACK_DETAIL_CHARS = 256

# Request headers (gRPC metadata) of one call, all together; a call over it is refused RESOURCE_EXHAUSTED.
MAX_METADATA_BYTES = 16 * 1024

# Metadata key of the per-actor credential that Register returns (every later call carries it).
CREDENTIAL_METADATA_KEY = "tandem-credential"
# Metadata key of the enrollment token the fleet minted for an actor (tandem_wire/enrollment.py), sent on Register.
ENROLLMENT_METADATA_KEY = "tandem-enrollment"
