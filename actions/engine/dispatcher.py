"""The dispatcher process: many receiver calls in flight from one process, claims in batches.

Why a process of its own: with a real receiver's latency (hundreds of ms), throughput is bounded
by the calls in flight, not by the database. A solo Celery worker holds one call in flight; the
threads pool holds C, but pays a broker message, a task and a claim transaction per action. The
dispatcher claims up to ``batch_size`` AUTHORIZED actions in one transaction
(``submission_begin_batch``: one commit for the batch, each action with its own lease, event and
attempt), then hands each claim to one of ``concurrency`` threads, which calls the receiver and
records the answer through the same service as every other dispatch (``submission_send`` and the
lease-fenced record, the fault points, the outcome table). It claims at most one batch ahead of
its threads (at most one action per thread, and only while the lease outlasts that wait), so
under load every claim is a full batch and a claimed action waits for at most one call.

Records are group-committed (``RecordGroups``) by a recorder thread of the dispatcher's own: a
thread whose call has returned leaves its answer with the recorder and goes on to its next call;
the recorder records every answer waiting in one transaction (``submission_record_group``) and
the answers that arrived meanwhile in the next, as soon as that one commits. Each answer is still
recorded as soon as the recorder is free, under its own lease fence. Measured (README, "Worker
profiles", two dispatchers of 18 threads at 200 ms): threads that waited for their own commits
spent about a tenth of their time waiting and reached 70-77 % of their in-flight bound; leaving
the answer with whichever calling thread was recording brought that to about 80 % (that thread
then recorded instead of calling); a recorder thread of its own, with all C threads calling, to
85 % in two runs of three (72 % in the third: this machine's noise is that large). At most
``concurrency`` answers wait for the recorder; beyond that a thread waits for its own commit, so
a slow database slows the calls down rather than piling answers up.

Threads rather than asyncio: the receivers' adapters (the stripe SDK, the accounting client, SMTP)
and the ORM are synchronous; a network call releases the GIL, so threads give the concurrency
without a second, async, copy of every adapter (measured: README, "Worker profiles").

Nothing here is needed for correctness. The AUTHORIZED sweep still runs in the Celery beat, so an
action is sent even when no dispatcher runs; a dispatcher killed with calls in flight leaves
SUBMITTING rows whose leases expire to UNKNOWN and reconciliation, as a killed worker does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection

from actions.engine.claim import Claim, ClaimOutcome, submission_begin_batch
from actions.engine.faults import fault_point
from actions.engine.record import submission_record_group
from actions.engine.send import Sent, submission_send
from actions.engine.throttle import throttle_wait, throttling_enabled
from actions.foundation.trail import Actor
from actions.kinds import kind_for
from actions.models import Action, ActionStatus

log = logging.getLogger(__name__)

# Who claimed, in the audit trail: a person reading it can tell the dispatcher process's batched
# claims from a Celery task's ("system:dispatcher").
DISPATCHER_PROCESS = Actor.system("dispatcher-process")
# A pool thread's result when it left its answer with the recorder (RecordGroups.hand_over).
HANDED_OVER = "handed_over"


@dataclass
class DispatcherStats:
    claimed: int = 0
    stale: int = 0
    recorded: dict[str, int] | None = None
    claim_transactions: int = 0  # including the ones that found nothing to claim
    # The actions claimed by each of the last 1,000 non-empty ones (a long-lived process keeps
    # no more), and how many there were in all.
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000))
    batches: int = 0
    errors: int = 0
    # Record transactions, and how many answers each of the last 1,000 recorded together.
    record_transactions: int = 0
    group_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000))

    def count(self, result: str) -> None:
        if self.recorded is None:
            self.recorded = {}
        self.recorded[result] = self.recorded.get(result, 0) + 1


class Dispatcher:
    """Claim AUTHORIZED actions in batches and keep up to ``concurrency`` receiver calls in flight.

    ``idle_seconds``: how long to wait before looking again when nothing was claimable (doubling
    up to ``max_idle_seconds`` while the table stays empty, back to the start as soon as a claim
    succeeds). A finished call wakes the claim loop at once, so a free thread is refilled
    without waiting for the idle timer.
    """

    def __init__(
        self,
        *,
        concurrency: int,
        batch_size: int,
        idle_seconds: float = 0.05,
        max_idle_seconds: float = 1.0,
        stop: threading.Event | None = None,
    ) -> None:
        if concurrency < 1 or batch_size < 1:
            raise ValueError("concurrency and batch_size must be at least 1")
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.idle_seconds = idle_seconds
        self.max_idle_seconds = max_idle_seconds
        self.stop = stop or threading.Event()
        self.stats = DispatcherStats()
        self._outstanding = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._peak_outstanding = 0
        # A thread whose answer finds the recorder at work goes on to its next call; at most one
        # answer per thread may wait for the recorder before the threads wait with theirs.
        self.records = RecordGroups(on_group=self._count_group, on_recorded=self._recorded, backlog=concurrency)

    def shutdown(self) -> None:
        """Stop claiming, at once: an idle wait ends now rather than when its timer runs out."""
        self.stop.set()
        self._wake.set()

    @property
    def peak_outstanding(self) -> int:
        return self._peak_outstanding

    def run(self, *, until: Callable[[], bool] | None = None) -> DispatcherStats:
        """Dispatch until ``stop`` is set (or ``until()`` is true), then wait for the calls in flight."""
        self.records.start_recorder()
        try:
            self._loop(until)
        finally:
            # After the pool: every call has ended and left its answer; the recorder records
            # what waits before it ends.
            self.records.stop_recorder()
            connection.close()
        return self.stats

    def _loop(self, until: Callable[[], bool] | None) -> None:
        idle = self.idle_seconds
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="dispatch") as pool:
            try:
                while not self.stop.is_set() and not (until is not None and until()):
                    limit = self._claimable()
                    if limit <= 0:
                        self._wait(self.max_idle_seconds)
                        continue
                    asked = min(limit, self.batch_size)
                    claims = self._claim(asked)
                    claimed = [claim for claim in claims if claim.outcome == ClaimOutcome.CLAIMED]
                    for claim in claimed:
                        self._start(pool, claim)
                    if claimed:
                        idle = self.idle_seconds
                    if len(claims) < asked:
                        # The table had nothing more to claim just now: look again after the
                        # idle wait, or at once when a call finishes (its record may make a
                        # workflow's next step due), rather than with an empty claim straight
                        # away. Not woken by LISTEN/NOTIFY: measured, the listening backend reads
                        # the notification queue in a transaction of its own for every wake, one
                        # more commit per action than this poll costs (README, "Worker profiles").
                        self._wait(idle)
                        if not claimed:
                            idle = min(idle * 2, self.max_idle_seconds)
            finally:
                _close_thread_connections(pool, self.concurrency)

    # --- the claim loop's thread -----------------------------------------------------------

    def _claimable(self) -> int:
        """How many actions to claim now: 0 to wait for a call to finish.

        Claimed actions are the ones sent (one per thread) plus at most one batch waiting for a
        thread. Without that batch, a busy dispatcher would refill each freed thread with a claim
        of one action, one commit each, and batching would buy nothing under load. A waiting
        action's lease runs meanwhile, so the batch is at most one action per thread (each waits
        for at most one call ahead of it, at most the provider timeout) and only while the lease
        outlasts that wait and its own call with room to spare; otherwise none waits. A freed
        thread with nothing waiting for it is refilled at once, with whatever is claimable.
        """
        waiting_room = self.prefetch
        outstanding = self._outstanding
        if outstanding < self.concurrency:
            return self.concurrency + waiting_room - outstanding
        free = self.concurrency + waiting_room - outstanding
        return free if free >= min(self.batch_size, waiting_room) > 0 else 0

    @property
    def prefetch(self) -> int:
        """Actions claimed ahead of a free thread (see ``_claimable``)."""
        fits = settings.LEASE_SECONDS >= 3 * settings.PROVIDER_TIMEOUT_SECONDS
        return min(self.batch_size, self.concurrency) if fits else 0

    def _claim(self, limit: int) -> list[Claim]:
        try:
            action_pks = self._with_tokens(limit) if throttling_enabled() else None
            claims = submission_begin_batch(
                limit=min(limit, self.batch_size), action_pks=action_pks, actor=DISPATCHER_PROCESS
            )
        except Exception:
            # A deadlock with another batch, a dropped connection, a database restart: nothing
            # was claimed (the batch rolled back). Log it, drop the connection, try again later.
            with self._lock:
                self.stats.errors += 1
            log.exception("dispatcher: a batch claim failed; nothing of it was claimed")
            connection.close()
            self._wait(self.max_idle_seconds)
            return []
        self.stats.claim_transactions += 1
        claimed = sum(1 for claim in claims if claim.outcome == ClaimOutcome.CLAIMED)
        if claimed:
            self.stats.batch_sizes.append(claimed)
            self.stats.batches += 1
        self.stats.claimed += claimed
        self.stats.stale += sum(1 for claim in claims if claim.outcome == ClaimOutcome.STALE)
        return claims

    def _with_tokens(self, limit: int) -> list[int]:
        """With rate limits on, the actions whose receiver has a token now (taken before the claim,
        as for every dispatch: an action that must wait stays AUTHORIZED with no lease)."""
        ready = []
        rows = (
            Action.objects.filter(status=ActionStatus.AUTHORIZED)
            .order_by("status_changed_at", "pk")
            .values_list("pk", "kind")[:limit]
        )
        for pk, kind in rows:
            if throttle_wait(kind_for(kind).contract().receiver) <= 0:
                ready.append(pk)
        return ready

    def _start(self, pool: ThreadPoolExecutor, claim: Claim) -> None:
        with self._lock:
            self._outstanding += 1
            self._peak_outstanding = max(self._peak_outstanding, self._outstanding)
        future = pool.submit(_send_and_record, claim, self.records)
        future.add_done_callback(self._done)

    def _count_group(self, size: int) -> None:
        with self._lock:
            self.stats.record_transactions += 1
            self.stats.group_sizes.append(size)

    def _done(self, future: Future[str]) -> None:
        # Runs in the pool thread that made the call; the stats are shared, hence the lock.
        error = future.exception()
        if error is not None:
            log.error("dispatcher: a call's record failed; its lease expires to reconciliation", exc_info=error)
        with self._lock:
            if error is not None:
                self.stats.errors += 1
            elif future.result() != HANDED_OVER:  # counted by ``_recorded`` once committed
                self.stats.count(future.result())
            self._outstanding -= 1
        self._wake.set()

    def _recorded(self, sent: Sent, result: str | Exception) -> None:
        """An answer a thread handed over, recorded by the recorder's thread (see RecordGroups)."""
        if isinstance(result, Exception):
            log.error(
                "dispatcher: a call's record failed; its lease expires to reconciliation",
                exc_info=(type(result), result, result.__traceback__),
            )
            # The recorder's connection may be the reason; its next group starts on a fresh one.
            connection.close()
            with self._lock:
                self.stats.errors += 1
            return
        with self._lock:
            self.stats.count(result)
        fault_point("after_record")

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()


class RecordGroups:
    """Group commit for the answers of the dispatcher's threads.

    A thread whose call has returned hands its answer over. The dispatcher runs a recorder thread
    of its own (``start_recorder``): it records every answer waiting in one transaction, then the
    answers that arrived meanwhile, group after group, and the calling thread is free for its next
    call at once (``hand_over``), unless ``backlog`` answers are already waiting: then it waits
    until its own answer is committed, so a slow database slows the calls down instead of piling
    up answers in memory. ``record`` always waits. So each answer waits for at most one other
    transaction, a busy dispatcher commits many answers at once, and an idle one records each
    alone.

    Without a recorder thread (before ``start_recorder``, after ``stop_recorder``), the recorder
    is whichever thread found nobody recording: it records its own answer and every answer left
    with it meanwhile, until none is left, and only then goes back to calling.

    An answer handed over is reported to ``on_recorded`` (its result, or the error that stopped
    its record) by the recorder's thread, after its commit. A process killed before then loses
    the answer, as one killed between the call and the record does: the lease expires to
    reconciliation, which asks the receiver.
    """

    def __init__(
        self,
        *,
        record: Callable[[Sequence[Sent]], list[str | Exception]] | None = None,
        on_group: Callable[[int], None] | None = None,
        on_recorded: Callable[[Sent, str | Exception], None] | None = None,
        backlog: int = 0,
    ) -> None:
        self._record = record or (lambda sent: submission_record_group(sent=sent))
        self._on_group = on_group
        self._on_recorded = on_recorded
        self.backlog = backlog
        self._changed = threading.Condition()
        self._waiting: list[_Waiting] = []
        self._recording = False
        self._recorder: threading.Thread | None = None  # see ``start_recorder``
        self._stopping = False

    def record(self, sent: Sent) -> str:
        """Record ``sent`` (with whatever else is waiting) and return once it is committed."""
        result = self._enter(sent, may_leave=False)
        assert result is not None
        return result

    def hand_over(self, sent: Sent) -> str | None:
        """Record ``sent``, or leave it with the recorder at work: None, and ``on_recorded`` hears
        of it after its commit. Waits for the commit (and returns its result) when this thread
        becomes the recorder or the backlog is full."""
        return self._enter(sent, may_leave=self._on_recorded is not None)

    def _enter(self, sent: Sent, *, may_leave: bool) -> str | None:
        mine = _Waiting(sent)
        with self._changed:
            self._waiting.append(mine)
            self._changed.notify_all()  # wakes a recorder thread waiting for answers
            at_work = self._recorder is not None or self._recording
            if may_leave and at_work and len(self._waiting) <= self.backlog:
                # Under the lock, so the recorder takes it with its group already marked.
                mine.handed_over = True
                return None
            while mine.result is None and (self._recorder is not None or self._recording):
                self._changed.wait()
            if mine.result is None:
                self._recording = True
        if mine.result is None:
            self._record_until_none_waits()
        assert mine.result is not None
        if isinstance(mine.result, Exception):
            raise mine.result
        return mine.result

    # --- a recorder thread of its own ---------------------------------------------------------

    def start_recorder(self) -> None:
        """Record every answer in a thread of its own, until ``stop_recorder``.

        Without it the recorder is whichever calling thread found nobody recording, and under
        load it records group after group instead of calling: C - 1 calls in flight. With it,
        every calling thread leaves its answer (``hand_over``, backlog permitting) and all C
        stay on calls. It costs a thread and a database connection.
        """
        with self._changed:
            if self._recorder is not None:
                raise RuntimeError("the recorder thread is already running")
            self._stopping = False
            self._recorder = threading.Thread(target=self._serve, name="dispatch-recorder", daemon=True)
            self._recorder.start()

    def stop_recorder(self, timeout: float | None = None) -> None:
        """Record what waits, then end the recorder thread; later answers record themselves."""
        with self._changed:
            recorder = self._recorder
            self._stopping = True
            self._changed.notify_all()
        if recorder is not None:
            recorder.join(timeout)

    def _serve(self) -> None:
        try:
            while True:
                with self._changed:
                    while not self._waiting and not self._stopping:
                        self._changed.wait()
                    group, self._waiting = self._waiting, []
                    if not group:
                        # Stopping, nothing waits. In the same hold of the lock: an answer given
                        # after this finds no recorder and records itself.
                        self._recorder = None
                        return
                    self._recording = True
                try:
                    self._record_group(group)
                finally:
                    with self._changed:
                        self._recording = False
        except BaseException:
            # Answers given from now on must not wait for a thread that is gone: the next one
            # becomes the recorder, and records whatever was left here too.
            with self._changed:
                self._recorder = None
                self._changed.notify_all()
            raise
        finally:
            connection.close()  # a Django connection can only be closed by its own thread

    def _record_until_none_waits(self) -> None:
        """The recorder: one group after another, until no answer waits. Answers handed over
        while a group was being recorded have no thread of their own to record them."""
        try:
            while True:
                with self._changed:
                    group, self._waiting = self._waiting, []
                    if not group:
                        # In the same hold of the lock as the empty check: an answer handed over
                        # after it must find nobody recording and record itself, not be left
                        # with a recorder that is leaving.
                        self._recording = False
                        self._changed.notify_all()
                        return
                self._record_group(group)
        except BaseException:
            # The next answer must find nobody recording, or its thread would wait for ever.
            with self._changed:
                self._recording = False
                self._changed.notify_all()
            raise

    def _record_group(self, group: list[_Waiting]) -> None:
        results: list[str | Exception] = []
        try:
            results = self._record([waiting.sent for waiting in group])
        except Exception as error:  # submission_record_group answers per record; this is a bug
            results = [error] * len(group)
        finally:
            # Whatever happened, the others must not wait for ever: each gets its answer's
            # result (or the error that stopped the group).
            interrupted = RuntimeError("the record was interrupted")
            with self._changed:
                for index, waiting in enumerate(group):
                    waiting.result = results[index] if index < len(results) else interrupted
                self._changed.notify_all()
            if self._on_group is not None:
                self._on_group(len(group))
        if self._on_recorded is not None:
            for waiting in group:
                if waiting.handed_over:
                    assert waiting.result is not None
                    try:
                        self._on_recorded(waiting.sent, waiting.result)
                    except Exception:
                        # Its record is committed; the report of it must not stop the recorder.
                        log.exception("dispatcher: reporting a recorded answer failed")


@dataclass
class _Waiting:
    sent: Sent
    handed_over: bool = False  # its thread left; ``on_recorded`` hears of its result
    result: str | Exception | None = None


def _send_and_record(claim: Claim, records: RecordGroups) -> str:
    """In a pool thread: the call, then its record with whatever other answers are waiting.

    The record runs on the database connection of whichever thread records the group (this one,
    when it finds nobody recording). A thread's connection is kept between calls (a pooled thread
    lives as long as the dispatcher), and dropped after an error so the next call starts on a
    fresh one.
    """
    assert claim.action is not None and claim.attempt is not None and claim.lease_token is not None
    started = time.monotonic()
    _drop_connection_if_dead()
    try:
        sent = submission_send(action=claim.action, attempt=claim.attempt, lease_token=claim.lease_token)
        if sent is None:
            return "lease_too_short"
        status = records.hand_over(sent)
        if status is None:
            log.debug(
                "action_id=%s sent in %.3f s; its record is left with the recorder",
                claim.action.action_id,
                time.monotonic() - started,
            )
            return HANDED_OVER
        fault_point("after_record")
        log.debug("action_id=%s sent and recorded in %.3f s", claim.action.action_id, time.monotonic() - started)
        return status
    except Exception:
        connection.close()
        log.debug("action_id=%s not recorded after %.3f s", claim.action.action_id, time.monotonic() - started)
        raise


# A thread's connection unused for this long is checked before its next call: a database
# restart or failover meanwhile would otherwise surface only at the record, after the receiver
# had answered. Busier threads skip the check (its round trip would cost every call).
CONNECTION_CHECK_AFTER_IDLE_SECONDS = 5.0
_last_use = threading.local()


def _drop_connection_if_dead() -> None:
    now = time.monotonic()
    idle_since = getattr(_last_use, "at", now)
    _last_use.at = now
    idle = now - idle_since > CONNECTION_CHECK_AFTER_IDLE_SECONDS
    if idle and connection.connection is not None and not connection.is_usable():
        connection.close()


def _close_thread_connections(pool: ThreadPoolExecutor, threads: int) -> None:
    """Close each pool thread's database connection before the threads end (a connection left to
    the garbage collector stays open on the server until then). A Django connection can only be
    closed by its own thread, so each thread gets one closing task; the barrier keeps any thread
    from taking two."""
    barrier = threading.Barrier(threads)

    def close() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=10)
        connection.close()

    for _ in range(threads):
        pool.submit(close)
