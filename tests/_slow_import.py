"""A module whose import takes 2.5 s: a reward worker pool's `imports` that is slow to
start (tests/test_rewards.py: a pool's start-up is not part of any job's timeout)."""

import time

time.sleep(2.5)
