"""Stage engines (Thinker, Talker, Code2Wav) and the factory that builds them from a profile.

Their request and result messages are in `backends.contracts`.

Nothing here imports the Triton stub: each engine is a single-threaded object that a serving
thread steps, so every engine is testable in-process.
"""
