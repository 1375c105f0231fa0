"""gRPC streaming client for the duplex model."""
