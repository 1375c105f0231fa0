"""Codes of the S3 speech codebook (the Talker draws them, token2wav decodes them) that mean
something by themselves."""

SILENCE_CODE = 4218  # silence: a stream's first left context and token2wav's look-ahead padding
