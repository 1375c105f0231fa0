"""Arguments every test server gets (a module of its own: `conftest` names clash across test dirs)."""

# Triton 2.51 counts a request it refuses for an unknown sequence ("must specify the START
# flag": test_duplex_bad_input sends one on purpose, and a client END that arrives after a
# session released its own sequence is one too) as in flight for good, so a server stop waits
# its whole exit timeout: 5 s instead of the launcher's 20 s of CI time.
TEST_EXIT_ARGS = ["--exit-timeout-secs=5"]
