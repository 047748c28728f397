"""The moments the tests' manual clocks start at."""

# 2026-01-01 00:00:00.000 UTC, a midnight.
T0 = 1_767_225_600_000
SECOND = 1_000
MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000
# The fixture clock starts at 10:00 UTC on that day.
TEN_AM = T0 + 10 * HOUR
# The failure tests' clock starts at noon.
NOON = T0 + 12 * HOUR
