"""The Thinker stage: per-session prompt layout, the duplex listen/speak policy, the Thinker ->
Talker handoff and the model that assembles the Qwen3 LLM with the streaming audio encoder.

The engine that batches many sessions on one runner is `backends.stages.thinker_engine`.
"""
