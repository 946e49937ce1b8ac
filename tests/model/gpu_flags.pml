/* The flags-mode stream barrier and its watchdog (lib/src/gpu/flag_barrier.cpp), for spin.
 *
 * N processes, each with a host (E calls, one episode each), a stream (runs them in order) and
 * a watchdog. As in the code: a call checks the job (a recorded failure: it throws and
 * the host enqueues nothing more), enqueues the episode and stores `enqueued`, then releases
 * itself if it sees a failure recorded meanwhile. A stream's episode e: its work, a plain write
 * arrived[me] = e (a GPU write: it may lower a value the CPU raised), a wait on each peer's
 * arrived >= e in turn, then passed[me] = e. A watchdog that sees a death (-DDEATHS) or decides a
 * timeout (-DTIMEOUTS) records the failure and releases: released = 1, then each process's
 * arrived is raised (CAS, one process at a time) to the highest episode enqueued + LEAD; it
 * raises again whenever a living process's stream has not passed all it enqueued. A death stops
 * the process's host, stream and watchdog at any step, the watchdog's release included.
 *
 * Process 2's watchdog never runs (as if stopped): the others' must do its work.
 *
 * Checked: (safety) a stream passes episode e before every peer's work of e is done only when
 * the streams were released; (no hung stream) once everything has stopped, no living stream
 * waits: spin reports an invalid end state if a stream can block for ever in a wait (or a
 * watchdog waits for a stream that cannot move).
 *
 * The counters are 4 bits wide and compared cyclically, as the code's 64-bit words are
 * (cyclic_before: a - b taken as signed); the release adds a quarter of the range (the code's
 * 2^62). The job starts MOD - 2 episodes in (flags, work and `enqueued` at START), so the
 * episodes run across the wrap: 15, then 0.
 *
 * -DBUG_NO_RERAISE: the watchdog releases once and never again; spin must find the stream that
 * a living peer's late write (over the release) leaves waiting (tests/model/check-model expects
 * it to). -DBUG_PLAIN_COMPARE: the streams' waits and the release compare plainly (>=), not
 * cyclically; spin must find the early pass at the wrap.
 *
 * Abstracted away: memory ordering (a stream's write follows a system-wide fence; spin is sequentially consistent); the
 * pidfds and polls (a watchdog may notice a death at any later step); the user's later calls
 * (they throw once a failure is recorded, as the host's check models).
 */

#define N 3   /* the macros below spell out three processes */
#ifndef E
#define E 2
#endif
#define MOD 16    /* the counters' range: 4 bits */
#define HALF 8
#define LEAD 4    /* MOD / 4, as 2^62 is of 2^64: a released flag passes every wait */
#define START 14  /* the episodes before the model's: its episodes are 15 and 0 */
#define WRAP(x) ((x) % MOD)
/* a is at or after b, cyclically: what the code's !cyclic_before(a, b) and the streams'
 * CU_STREAM_WAIT_VALUE_GEQ on 64 bits compute. CGEQ is always the true order (the assertions);
 * GEQ is the protocol's, plain in the seeded bug. */
#define CGEQ(a, b) (WRAP((a) + MOD - (b)) < HALF)
#ifdef BUG_PLAIN_COMPARE
#define GEQ(a, b) ((a) >= (b))
#else
#define GEQ(a, b) CGEQ(a, b)
#endif

byte done[N];   /* bit k - 1: the process's work of its k-th episode here is done */
byte arrived[N] = START;
byte passed[N] = START;
byte enqueued[N] = START;
bool dead[N];
byte streams_done[N];   /* of the process's streams (two for process 0 with -DTWO_STREAMS) */
bool refused[N];        /* a call threw (a failure was recorded): the host calls no more */
bool lost = false;       /* a failure recorded in the segment */
bool released = false;
byte deaths_left = 1;
byte timeouts_left = 1;

#define living_drained ((dead[0] || passed[0] == enqueued[0]) && \
  (dead[1] || passed[1] == enqueued[1]) && (dead[2] || passed[2] == enqueued[2]))
#ifdef TWO_STREAMS
#define STREAMS0 2
#else
#define STREAMS0 1
#endif
#define hosts_done ((dead[0] || streams_done[0] == STREAMS0) && (dead[1] || streams_done[1] == 1) && \
  (dead[2] || streams_done[2] == 1))
#define anyone_dead (dead[0] || dead[1] || dead[2])
#define MAX2(a, b) (GEQ(a, b) -> (a) : (b))
#define TOP MAX2(enqueued[0], MAX2(enqueued[1], enqueued[2]))

/* The release, a CAS per process; the caller's death may stop it between two. */
inline release(who, top, q) {
  atomic { released = true; top = TOP };
  for (q : 0 .. N - 1) {
    if :: dead[who] -> break :: else -> skip fi;
    atomic { if :: !GEQ(arrived[q], WRAP(top + LEAD)) -> arrived[q] = WRAP(top + LEAD)
             :: else -> skip fi }
  };
  atomic { top = 0; q = 0 }   /* dead locals, cleared: fewer distinct states */
}

/* Whether a release would change a flag now. */
#define would_raise (!GEQ(arrived[0], WRAP(TOP + LEAD)) || !GEQ(arrived[1], WRAP(TOP + LEAD)) || \
  !GEQ(arrived[2], WRAP(TOP + LEAD)))

/* A process's stream, with its host's calls folded in: the host runs ahead of its stream, so its
 * call of episode e is modelled when the stream reaches e: made before any failure was recorded
 * (then it is enqueued), or, once one is, either made before the host saw it (enqueued; the host
 * then sees the failure and releases) or refused (the call throws; the host calls no more).
 *
 * The stream runs the process's episodes first, first + step, ... up to E. With -DTWO_STREAMS,
 * process 0 calls episode 1 on one stream and episode 2 on another: the second call comes after
 * the first (the host's order), and its stream first waits until the process's `passed` is at
 * least the previous episode (-DBUG_NO_ORDER leaves that wait out: spin must find the early
 * pass that the second stream's flag then allows). */
proctype Stream(byte me; byte first; byte step) {
  byte k = first;   /* the process's episode count; the episode's number is e */
  byte e = WRAP(START + first);
  byte top;
  byte q;
  do
  :: dead[me] -> break
  :: !dead[me] && k > E -> break
  :: !dead[me] && k <= E ->
    /* the host made the previous call first (on this stream or another), or stopped calling */
    (dead[me] || refused[me] || enqueued[me] == WRAP(e + MOD - 1));
    if
    :: atomic { !dead[me] && !refused[me] && !lost -> enqueued[me] = e }
    :: atomic { !dead[me] && !refused[me] && lost -> enqueued[me] = e; release(me, top, q) }
    :: atomic { !dead[me] && lost -> refused[me] = true }; break
    :: refused[me] -> break
    :: dead[me] -> break
    fi;
#ifndef BUG_NO_ORDER
    if
    :: step > 1 && k > 1 ->   /* a stream that did not make the previous call: the order wait */
      (dead[me] || GEQ(passed[me], WRAP(e + MOD - 1)));
      if :: dead[me] -> break :: else -> skip fi
    :: else -> skip
    fi;
#endif
    atomic { done[me] = done[me] | (1 << (k - 1)); arrived[me] = e }   /* work, fence, write */
    /* the waits (one per peer, here checked together): a hung stream blocks here */
    (dead[me] || ((me == 0 || GEQ(arrived[0], e)) && (me == 1 || GEQ(arrived[1], e)) &&
                  (me == 2 || GEQ(arrived[2], e))));
    if :: dead[me] -> break :: else -> skip fi;
    /* safety: no early pass unless released: every process's work of episodes 1..k is done */
    assert(released || ((done[0] & ((1 << k) - 1)) == (1 << k) - 1 &&
                        (done[1] & ((1 << k) - 1)) == (1 << k) - 1 &&
                        (done[2] & ((1 << k) - 1)) == (1 << k) - 1));
    passed[me] = e;
    atomic { k = k + step; e = WRAP(e + step) }
  od;
end_idle:
  streams_done[me]++
}

proctype Watchdog(byte me) {
  byte top;
  byte q;
  /* watching */
  do
  :: dead[me] -> goto stopped
  :: !dead[me] && lost -> break
  :: !dead[me] && !lost && anyone_dead -> lost = true; break
#ifdef TIMEOUTS
  /* a timed call's deadline passed while this process's stream had not passed it */
  :: atomic { !dead[me] && !lost && timeouts_left > 0 && passed[me] != enqueued[me] ->
      timeouts_left--; lost = true }; break
#endif
  :: !dead[me] && !lost && hosts_done && living_drained -> goto stopped   /* the job ended */
  od;
#ifdef DEATHS
  release(me, top, q);   /* this process may die in the middle of it */
#else
  atomic { release(me, top, q) }
#endif
  /* released: raise again while a living stream has not passed all it enqueued */
  do
  :: dead[me] -> break
#ifndef BUG_NO_RERAISE
  :: !dead[me] && !living_drained && would_raise -> atomic { release(me, top, q) }
#endif
  :: !dead[me] && living_drained && hosts_done -> break
  od;
stopped:
  skip
}

proctype Killer() {
  byte p;
  if
  :: deaths_left > 0 ->
    if
    :: p = 0
    :: p = 1
    :: p = 2
    fi;
    atomic { deaths_left--; dead[p] = true; p = 0 }
  :: true -> skip
  fi
}

init {
  byte p;
  atomic {
#ifdef TWO_STREAMS
    run Stream(0, 1, 2);
    run Stream(0, 2, 2);
#else
    run Stream(0, 1, 1);
#endif
    run Stream(1, 1, 1);
    run Stream(2, 1, 1);
    /* Two watchdogs: process 2's is stopped (SIGSTOP) throughout; any living one suffices. */
    run Watchdog(0);
    run Watchdog(1);
#ifdef DEATHS
    run Killer()
#endif
  }
}
