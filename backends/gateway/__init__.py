"""The WebSocket gateway in front of the `duplex` model: browsers and WebSocket SDKs speak to it,
it speaks the duplex contract (docs/duplex_contract.md) to Triton over one gRPC stream per
session. A thin translator: admission, authentication, limits, protocol codecs and usage; no
model logic (docs/gateway.md)."""
