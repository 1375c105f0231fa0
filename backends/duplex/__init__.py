"""The duplex protocol: uplink parsing, 1-second units, sessions, events, the stage pipeline.

Triton-free: the `duplex` model.py hands requests to `SessionManager` together with a
`StageClients` (gRPC streams to the server itself in production, in-process engines in tests).
"""
