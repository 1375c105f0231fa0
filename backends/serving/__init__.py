"""Serving glue: the launcher, repository rendering, and the Triton-facing adapters.

Only modules named `triton_*` touch the Python-backend stub, and they receive the
`triton_python_backend_utils` module as an argument instead of importing it, so every
other module here imports and tests without a server.
"""
