"""The weight path to actors: versions, shared memory, the publisher, the relay."""
