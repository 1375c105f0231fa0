"""The duplex protocol: uplink parsing, 1-second units, sessions, events, the stage pipeline.

Triton-free: the `duplex` model.py hands requests to `SessionManager` together with a
`StageClients` (backends/contracts/stage_clients.py: stage calls in the server, scripted stages
in tests).
"""
