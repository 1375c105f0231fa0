"""Talker (Stage 1) engine parts: per-request condition state and prompt planning.

The engine itself is `backends.stages.talker_engine.TalkerEngine`; these modules hold what it
keeps per request and how it decides where a condition's rows go in the Talker KV.
"""
