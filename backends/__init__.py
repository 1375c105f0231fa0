"""MiniCPM-o 4.5 duplex serving: runner, stage models, duplex protocol, sessions, WebSocket gateway.

The packages form one-way layers, bottom to top; a package imports only packages below it
(thinker and talker share a layer and do not import each other):

    contracts < runner < models < audio < checkpoint < thinker, talker < stages < duplex < serving < gateway

tests/test_layers.py holds the code to this order.
"""
