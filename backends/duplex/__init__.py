"""The duplex protocol: uplink parsing, 1-second units, sessions, events, the stage pipeline.

Triton-free: the `duplex` model.py hands requests to `SessionManager` together with a
`StageClients` (BLS calls in the server, in-process engines in tests).
"""
