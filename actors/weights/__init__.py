"""The weight path's actor half: fetch and stage a version by the transport the learner names, relay it,
hold the swap's state, and apply the version as its kind says (map: tandem_wire/weights/README.md)."""
