"""Stage engines (Thinker, Talker, Code2Wav) and their Triton tensor contracts.

Nothing here imports the Triton stub: each engine is a single-threaded object that a serving
thread steps, so every engine is testable in-process.
"""
