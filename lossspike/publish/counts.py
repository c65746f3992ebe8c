"""What the publisher did not write, by cause: every row is written or counted in one field."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counts:
    """What the publisher did not write, by cause; a snapshot for logs and tests.

    Every row is counted once: `written`, or one `dropped_*` field. `steps_dropped`
    counts rows written with a NULL step because their step fit no BIGINT.
    """

    written: int = 0
    dropped_queue_full: int = 0
    dropped_sink_error: int = 0
    dropped_refused: int = 0
    dropped_not_numeric: int = 0
    dropped_out_of_range: int = 0
    dropped_too_many: int = 0
    dropped_long_name: int = 0
    dropped_log_failed: int = 0
    dropped_at_finish: int = 0
    dropped_at_exit: int = 0
    dropped_flusher_error: int = 0
    steps_dropped: int = 0
    sink_errors: int = 0

    def dropped(self) -> int:
        return self.unsent() + (
            self.dropped_not_numeric
            + self.dropped_out_of_range
            + self.dropped_too_many
            + self.dropped_long_name
            + self.dropped_log_failed
        )

    def unsent(self) -> int:
        """Rows that entered the queue and were not written: finish() is True only when this is 0."""
        return (
            self.dropped_queue_full
            + self.dropped_sink_error
            + self.dropped_refused
            + self.dropped_at_finish
            + self.dropped_at_exit
            + self.dropped_flusher_error
        )
