"""MiniCPM-o 4.5 duplex serving: runner, stage models, duplex protocol, sessions."""
