"""One clock for every host: the database server's, read through this host's own.

Leases, approval expiry and the receivers' key retention are decided by comparing a time
stored in the database with "now". Were "now" each worker's own clock, a worker whose clock runs
two minutes behind would still send under an approval that expired two minutes ago, and a
sweeper whose clock runs ahead would take over leases that still hold. So the engine asks
``database_clock_now()``: this host's time corrected by its offset from the database server's
clock, measured with one ``SELECT`` at most every ``OFFSET_TTL_SECONDS`` (the middle of the
round trip is taken as the moment the server read its clock, so the error is at most half a
round trip), and applied only past ``OFFSET_TOLERANCE``. The dispatch path pays no statement
for it.

The services that record decisions (proposals approved by policy, a manager's or a plan's
approval, the coordinator's steps) take their default "now" from here too: an approval's expiry
is counted from the decision's time, and a web host whose clock runs two minutes behind would
otherwise give every approval it records two minutes less life (one ahead, two minutes more).

A host whose clock is stepped (an NTP correction, a VM resumed) is wrong by the step for at most
``OFFSET_TTL_SECONDS``; the lease fence and the idempotency keys still stand behind that.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from django.utils import timezone

from actions.foundation.sql import database_now

OFFSET_TTL_SECONDS = 30.0
# Offsets below this are not applied: a host kept by NTP is within milliseconds, which no lease
# or expiry cares about, and the host's own clock then keeps every time this process writes in
# the order it wrote them (the engine's and the rest of the code's).
OFFSET_TOLERANCE = timedelta(milliseconds=500)
ZERO = timedelta(0)

_lock = threading.Lock()
_offset: timedelta | None = None
_measured_at = 0.0


def clock_offset_measure() -> timedelta:
    """The database's clock minus this host's, now."""
    before = timezone.now()
    server = database_now()
    after = timezone.now()
    return server - (before + (after - before) / 2)


def database_clock_now() -> datetime:
    """Now, on the database server's clock (see the module's docstring)."""
    global _offset, _measured_at
    if _offset is None or (time.monotonic() - _measured_at > OFFSET_TTL_SECONDS):
        offset = clock_offset_measure()
        with _lock:
            _offset, _measured_at = offset, time.monotonic()
    return timezone.now() + (_offset if abs(_offset) > OFFSET_TOLERANCE else ZERO)


def clock_offset_forget() -> None:
    """Measure the offset again at the next call (tests that move this host's clock)."""
    global _offset
    with _lock:
        _offset = None

