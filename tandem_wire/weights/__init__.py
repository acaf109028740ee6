"""The weight path's wire-level half, which the learner (learner/weights/) and the actors (actors/weights/)
share: what a version is (manifest.py), how its digest is checked (digest.py), how its chunks are
encoded (chunks.py), where a same-host actor can share memory with the learner (shared_memory.py), and
the table of transports a version travels by (transports.py). README.md is the whole path's map."""
