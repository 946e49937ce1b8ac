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
 * -DBUG_NO_RERAISE: the watchdog releases once and never again; spin must find the stream that
 * a living peer's late write (over the release) leaves waiting (tests/model/check-model expects
 * it to).
 *
 * Abstracted away: the cyclic compare (no episode here comes near 2^63 from another); memory
 * ordering (a stream's write follows a system-wide fence; spin is sequentially consistent); the
 * pidfds and polls (a watchdog may notice a death at any later step); the user's later calls
 * (they throw once a failure is recorded, as the host's check models).
 */

#define N 3   /* the macros below spell out three processes */
#ifndef E
#define E 2
#endif
#define LEAD 8   /* more than any episode here: a released flag passes every wait */

byte work[N];
byte arrived[N];
byte passed[N];
byte enqueued[N];
bool dead[N];
bool host_done[N];
bool lost = false;       /* a failure recorded in the segment */
bool released = false;
byte deaths_left = 1;
byte timeouts_left = 1;

#define living_drained ((dead[0] || passed[0] == enqueued[0]) && \
  (dead[1] || passed[1] == enqueued[1]) && (dead[2] || passed[2] == enqueued[2]))
#define hosts_done ((dead[0] || host_done[0]) && (dead[1] || host_done[1]) && \
  (dead[2] || host_done[2]))
#define anyone_dead (dead[0] || dead[1] || dead[2])
#define MAX2(a, b) ((a) > (b) -> (a) : (b))
#define TOP MAX2(enqueued[0], MAX2(enqueued[1], enqueued[2]))

/* The release, a CAS per process; the caller's death may stop it between two. */
inline release(who, top, q) {
  atomic { released = true; top = TOP };
  for (q : 0 .. N - 1) {
    if :: dead[who] -> break :: else -> skip fi;
    atomic { if :: arrived[q] < top + LEAD -> arrived[q] = top + LEAD :: else -> skip fi }
  };
  atomic { top = 0; q = 0 }   /* dead locals, cleared: fewer distinct states */
}

/* Whether a release would change a flag now. */
#define would_raise (arrived[0] < TOP + LEAD || arrived[1] < TOP + LEAD || \
  arrived[2] < TOP + LEAD)

/* A process's stream, with its host's calls folded in: the host runs ahead of its stream, so its
 * call of episode e is modelled when the stream reaches e: made before any failure was recorded
 * (then it is enqueued), or, once one is, either made before the host saw it (enqueued; the host
 * then sees the failure and releases) or refused (the call throws; the host calls no more). */
proctype Stream(byte me) {
  byte e = 1;
  byte top;
  byte q;
  do
  :: dead[me] -> break
  :: !dead[me] && e > E -> break
  :: !dead[me] && e <= E ->
    if
    :: atomic { !lost -> enqueued[me] = e }
    :: atomic { lost -> enqueued[me] = e; release(me, top, q) }
    :: lost -> break
    :: dead[me] -> break
    fi;
    atomic { work[me] = e; arrived[me] = e }   /* the work, a fence, the write */
    /* the waits (one per peer, here checked together): a hung stream blocks here */
    (dead[me] || ((me == 0 || arrived[0] >= e) && (me == 1 || arrived[1] >= e) &&
                  (me == 2 || arrived[2] >= e)));
    if :: dead[me] -> break :: else -> skip fi;
    /* safety: no early pass unless released */
    assert(released || (work[0] >= e && work[1] >= e && work[2] >= e));
    passed[me] = e;
    e++
  od;
end_idle:
  host_done[me] = true
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
  :: atomic { !dead[me] && !lost && timeouts_left > 0 && passed[me] < enqueued[me] ->
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
    for (p : 0 .. N - 1) {
      run Stream(p)
    }
    /* Two watchdogs: process 2's is stopped (SIGSTOP) throughout; any living one suffices. */
    run Watchdog(0);
    run Watchdog(1);
#ifdef DEATHS
    run Killer()
#endif
  }
}
