"""The weight path's learner half: publish versions, write shared files, plan the relay, and answer each
fetch by a transport (map: tandem_wire/weights/README.md)."""
