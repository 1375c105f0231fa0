"""Audio paths around the stages: the Thinker's audio front end (MiniCPM-o's streaming mel
window over the Whisper log-mel of backends/models/whisper_mel.py, the per-session streaming
encoder that turns each 1 s unit of 16 kHz audio into 10 LLM embeddings) and the Talker ->
Code2Wav codec windows.

Vocabulary: a `unit` is 16000 samples (1 s); a `chunk` is what one unit contributes to the
encoder (100 core mel frames plus redundancy frames, 50 encoder frames, 10 embeddings).
"""
