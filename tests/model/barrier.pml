/* The node barrier's protocol (lib/src/engine/node_barrier.cpp), for the spin model checker.
 *
 * N processes run E episodes of the barrier. As in the code: arriving is one fetch_add on a
 * monotonic counter; episode e is complete when the counter reaches (e + 1) * N; a waiter spins
 * on the counter, then announces that it sleeps (sleepers++), re-reads the counter, and sleeps
 * on the futex word `generation` with the value it read before announcing; the arrival that
 * completes an episode changes `generation` and wakes everyone only if it sees a sleeper. A
 * waiter that times out takes its arrival back with a CAS while the episode is incomplete, and
 * arrives again later. A process may die after any arrival (-DDEATHS; one death per run). Then, as in the code since
 * issue 24 (lib/src/engine/peer_watch.hpp): a waiter sleeps WITHOUT a timeout while its
 * process's watch is quiet; each surviving process's watch sees the death, raises its alarm,
 * increments `generation` and wakes everyone; a sleeper reads `generation`, then the alarm, and
 * once the alarm is up sleeps with a timeout (its periodic poll, a futex wait that may return at
 * any time) and looks for the dead peer. Every change to `generation` is an increment.
 *
 * Checked: (safety) no process passes episode e before every process has arrived at e and none
 * has taken its arrival back; generations never mix (a process passes e only once the counter
 * reached (e + 1) * N). (liveness, without deaths or timeouts) nobody sleeps for ever once all
 * have arrived: spin reports an invalid end state if a process can block in futex_wait with
 * the episode complete (a lost wake-up).
 *
 * -DBUG_NO_RECHECK removes the waiter's re-read of the counter after announcing its sleep: spin
 * must then find the lost wake-up (tests/model/check-model expects it to). -DBUG_ALARM_AFTER_WAKE
 * makes the watch raise its alarm after changing the word and waking: a sleeper can then read
 * the new word and the old alarm, and sleep for ever beside a dead peer (spin must find it).
 *
 * Abstracted away: memory ordering (spin is sequentially consistent; the code's Dekker pair,
 * the arrival and the sleepers count, is seq_cst, and the rest is acquire/release that the
 * counter's release sequence covers); the spin and yield phases (a waiter may go to sleep at
 * any time, so every choice of lib/src/waiting/waiter.hpp's policy, from load or from history, is a path
 * checked here; the per-slot `asleep_until` it reads is a hint outside the protocol); the 32-bit wrap of the futex word (2^32 increments while one
 * waiter reads it and sleeps); the multi-node release; a peer that leaves (its leave marks the
 * segment and increments the word as the watch does); the watch's stall-line wakes (they only
 * wake); pid liveness checks (modelled as the `dead` flags).
 */

#ifndef N
#define N 3
#endif
#ifndef E
#define E 3
#endif

byte arrivals = 0;      /* the monotonic arrival counter */
byte generation = 0;    /* the futex word: only ever incremented */
byte sleepers = 0;      /* waiters that announced a sleep */
bool asleep[N];         /* blocked in futex_wait */
byte arrived[N];        /* episodes each process has arrived at (and not taken back) */
bool dead[N];
byte deaths = 0;
bool alarmed[N];          /* the process's watch saw a peer exit: its waits poll */
byte passed[N];         /* episodes each process has completed */

inline futex_wake_all(i) {
  for (i : 0 .. N - 1) { asleep[i] = false }
}

proctype Process(byte me) {
  byte e = 0;
  byte ticket;
  byte seen;
  byte v;
  byte q;
  byte timeouts_left = 1;
  do
  :: e == E -> break
  :: e < E ->
retry:
    /* arrive: one fetch_add */
    atomic { ticket = arrivals; arrivals++; arrived[me]++ }
#ifdef DEATHS
    /* one death per run: a second changes nothing the first has not (each watch acts once) */
    if :: atomic { deaths == 0 -> dead[me] = true; deaths++ }; goto gone :: true -> skip fi;
#endif
    if
    :: ticket + 1 == (e + 1) * N ->
      /* the completer wakes sleepers only if it sees one (seq_cst load after the arrival) */
      if
      :: sleepers != 0 -> generation++; futex_wake_all(q)
      :: else -> skip
      fi;
      goto pass
    :: else -> skip
    fi;
wait:
    do
    :: arrivals >= (e + 1) * N -> goto pass        /* spinning saw the episode complete */
    :: arrivals < (e + 1) * N ->
      /* sleep: read the futex word, announce, re-read the counter, then futex_wait */
      seen = generation;
      sleepers++;
      if
#ifdef BUG_NO_RECHECK
      :: true ->   /* the bug the re-read prevents: sleeping on an episode that just completed */
#else
      :: arrivals < (e + 1) * N ->
#endif
#ifdef DEATHS
        if
        :: alarmed[me] ->
          /* a peer exited: a timed sleep (the 100 ms poll), which can end at any time */
          atomic { if :: generation == seen -> asleep[me] = true :: else -> skip fi };
          if :: !asleep[me] -> skip :: asleep[me] -> asleep[me] = false fi
        :: else ->
          /* the watch is quiet: no timeout; a sleeper nobody wakes is an invalid end state */
          atomic { if :: generation == seen -> asleep[me] = true :: else -> skip fi };
          !asleep[me]
        fi;
#else
        atomic { if :: generation == seen -> asleep[me] = true :: else -> skip fi };
        !asleep[me];   /* blocks until woken: a lost wake-up is an invalid end state here */
#endif
      :: else -> skip
      fi;
      sleepers--;
#ifdef DEATHS
      /* the poll: a peer that has not arrived is dead, and the episode is still incomplete */
      for (q : 0 .. N - 1) {
        if
        :: dead[q] && arrived[q] <= e && arrivals < (e + 1) * N -> goto lost
        :: else -> skip
        fi
      }
#endif
#ifdef TIMEOUTS
      /* a timeout (at most one per process, to bound the search): take the arrival back unless
       * the episode completed meanwhile, then retry */
      if
      :: timeouts_left > 0 ->
        timeouts_left--;
        atomic {
          v = arrivals;
          if
          :: v < (e + 1) * N -> arrivals = v - 1; arrived[me]--
          :: else -> skip
          fi
        };
        if :: v < (e + 1) * N -> goto retry :: else -> goto pass fi
      :: true -> skip
      fi;
#endif
    od;
pass:
    /* safety: everyone has arrived at e and the counter shows e complete */
    assert(arrivals >= (e + 1) * N);
    for (q : 0 .. N - 1) { assert(arrived[q] >= e + 1) }
    passed[me]++;
    e++
  od;
  goto done;
#ifdef DEATHS
lost:
  /* PeerLostError: the process leaves the barrier with an error */
  goto done;
gone:
  skip;
#endif
done:
  skip
}

#ifdef DEATHS
/* A process's watch (its thread): sleeps until another process exits, then raises the alarm,
 * changes the word and wakes every sleeper, once. It dies with its process. */
proctype Watch(byte me) {
  byte q;
end_watch:
  /* (the increment and the wake are one step here: a sleeper between them finds the word
   * changed, as it would be woken) */
#ifdef BUG_ALARM_AFTER_WAKE
  atomic { !dead[me] && deaths > 0 -> generation++; futex_wake_all(q) };
  alarmed[me] = true
#else
  atomic { !dead[me] && deaths > 0 -> alarmed[me] = true };
  atomic { generation++; futex_wake_all(q) }
#endif
}
#endif

init {
  byte p;
  atomic {
    for (p : 0 .. N - 1) {
      run Process(p);
#ifdef DEATHS
      run Watch(p)
#endif
    }
  }
}
