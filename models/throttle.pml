/*
 * VIRTIO_F_SQCQ_POLL: backpressure (docs/spec/virtio-sqcq.md, section 5).
 * One virtqueue whose device takes at most L requests at a time and says
 * so with VIRTQ_DOORBELL_F_THROTTLE, bit 1 of sq.flags, under TSO (x86)
 * memory, with one store buffer per thread.
 *
 *   submitter  driver thread, SQ producer: publishes N requests; holds the
 *              next one back while it last read THROTTLE set and a request
 *              is outstanding (D1), with the held record, fence (5) and a
 *              second read of sq.flags (D3), and waits on the driver's own
 *              semaphore `release`
 *   device     device poll thread, SQ consumer and CQ producer: takes at
 *              most L requests (taken, not completed), sets THROTTLE when
 *              it reaches L, completes them one at a time in any order,
 *              clears THROTTLE when it falls to LOW before it publishes
 *              that completion (T2), then looks at the ring again (T3)
 *   poller     driver poll thread, CQ consumer: harvests the used ring,
 *              records how many it harvested, reads sq.flags, then the held
 *              record, and releases the submitter if THROTTLE is clear or
 *              nothing is outstanding (D2, D3)
 *   memory     drains store buffers to memory (tso.pml)
 *
 * The NEED_WAKEUP handshake on both doorbells is that of need_wakeup.pml.
 *
 * Rules left out, each in a configuration that needs it (where the
 * other release path is missing: no fence 6, or no count) must fail:
 *   -DNO_T2_ORDER  T2: THROTTLE cleared after the completion is published
 *   -DNO_T1        T1: THROTTLE also set while nothing is outstanding (a
 *                      backstore that refuses work while the device is
 *                      idle), cleared when the device next takes a request
 *   -DNO_T3        T3: at its limit, the device waits for sq.idx to change
 *   -DNO_FENCE_5   D3: no fence between the held record and the reads
 *   -DNO_D2        D2: the poller reads sq.flags after cq.idx but before
 *                      the used.idx that reveals what it consumes (fails
 *                      with -DN=3 -DNO_D1)
 *   -DNO_D1        D1: the submitter holds even with nothing outstanding,
 *                      the poller releases only on a clear THROTTLE (fails
 *                      with -DCOUNT_FENCE -DNO_T1)
 * -DCOUNT_FENCE adds fence (6) to the poller, between the store of its
 * harvested count and its read of sq.flags and the held record. With it
 * the driver's count of outstanding requests (D1) is exact across its two
 * threads, and T1, T2 and D2's read are needed for speed only: the model
 * with -DCOUNT_FENCE -DNO_T1 -DNO_T2_ORDER -DNO_D2 verifies. Without it,
 * as here by default, T1 and T2 keep the queue live. models/README.md has
 * the counterexamples.
 *
 * Ring entries (avail.ring, used.ring) are written straight to memory,
 * before the index store that publishes them, as in restart.pml.
 */

#ifndef N
#define N 2                 /* requests the submitter publishes */
#endif
#ifndef SBSZ
#define SBSZ 4              /* store buffer entries per thread */
#endif
#ifndef L
#define L 1                 /* requests the device takes at most, 1 or 2 */
#endif
/* The reference implementation's hysteresis: set at L, clear at
 * L - ceil(L/4) (1 -> 0, 2 -> 1). */
#define LOW (L - (L + 3) / 4)

/* Driver-internal locations: the submitter's held record and the count
 * of requests the poller harvested. */
#define NEXTRA 2
#define HELD EXTRA
#define HARV (EXTRA + 1)
#define PR_EXTRA(l) if :: (l) == HELD -> printf("held") :: else -> printf("harvested") fi

#include "tso.pml"

byte release;               /* driver-internal semaphore: poller -> submitter */

bit inflight[N + 1];        /* per request id: taken, not yet completed */
byte completed[N + 1];      /* per request id: completions by the device */
byte seen[N + 1];           /* per request id: harvests by the poller */
byte nseen;                 /* requests harvested, for the liveness claim */

#ifdef NO_FENCE_5
#define FENCE_5 skip
#else
#define FENCE_5 fence(SUB)
#endif
#ifdef COUNT_FENCE
#define FENCE_6 fence(DRV)
#else
#define FENCE_6 skip
#endif

/*
 * Driver thread, SQ producer. Before each request: if the sq.flags it
 * last read had THROTTLE, it records that it holds, fence (5), reads
 * sq.flags and the harvested count again, and waits for the poller's
 * release while THROTTLE is set and a request is outstanding (D1, D3).
 * Then: entry and avail.idx, sq.idx, fence (1), sq.flags, kick if
 * NEED_WAKEUP (D4: THROTTLE does not change the kick).
 */
active proctype submitter() {
    byte k = 1;
    byte f;                 /* sq.flags as last read */
    byte h;                 /* harvested count as read */

    do
    :: k <= N ->
        if
        :: (f & THROTTLE) != 0 ->
            store(SUB, HELD, 1);
            FENCE_5;
            load(SUB, SQ_FLAGS, f);
            load(SUB, HARV, h);
            do
#ifdef NO_D1
            :: (f & THROTTLE) != 0 ->
#else
            :: (f & THROTTLE) != 0 && h + 1 != k ->
#endif
                WAIT(release, SUB);     /* a completion is owed: must be released */
                load(SUB, SQ_FLAGS, f);
                load(SUB, HARV, h)
            :: else -> break
            od;
            h = 0;
            store(SUB, HELD, 0)
        :: else -> skip
        fi;
        atomic { mem[AVAIL_RING + k - 1] = k; store(SUB, AVAIL_IDX, k) };
        store(SUB, SQ_IDX, k);
        fence(SUB);
        load(SUB, SQ_FLAGS, f);
        if
        :: (f & NEED_WAKEUP) != 0 -> notify(kick, SUB)
        :: else -> skip
        fi;
        k++
    :: else -> break
    od
}

/*
 * Device poll thread. Takes requests while it has fewer than L; sets
 * THROTTLE on reaching L (T1: only with a request outstanding). A request
 * it has taken completes at any moment (its backstore answers): used
 * entry, THROTTLE cleared if it falls to LOW (T2, before used.idx),
 * used.idx, cq.idx, fence (3), cq.flags, call if NEED_WAKEUP; then it
 * looks at the ring again (T3). It sleeps, as in need_wakeup.pml, only
 * with nothing outstanding. sqf is the value it last stored to sq.flags:
 * every store writes both bits (T4).
 */
active proctype device() {
    byte last_sq;           /* last sq.idx value acted on */
    byte next_avail;        /* next avail ring index to take */
    byte used;              /* used.idx published so far */
    byte n;                 /* requests taken, not yet completed */
    byte sqf;               /* sq.flags as last stored */
    byte v, a, f, i, j;

poll:
    if
    :: n > 0 -> goto complete   /* a request in flight completes now */
    :: skip
    fi;
    load(DEV, SQ_IDX, v);
    if
    :: v != last_sq -> goto work
    :: else -> v = 0;
        if
        :: n > 0 -> goto complete
        :: else ->
#ifdef NO_T1
            if                  /* the backstore refuses work while idle */
            :: (sqf & THROTTLE) == 0 ->
                sqf = sqf | THROTTLE;
                store(DEV, SQ_FLAGS, sqf)
            :: skip
            fi;
#endif
            if
            :: goto poll            /* spin window not over yet */
            :: goto prepare_sleep   /* spin window over */
            fi
        fi
    fi;

work:
    last_sq = v;
    v = 0;
relook:
    load(DEV, AVAIL_IDX, a);
    assert(a >= last_sq);       /* sq.idx is never ahead of avail.idx */
    do
    :: next_avail < a && n < L ->
        d_step {                /* takes the entry */
            v = mem[AVAIL_RING + next_avail];
            assert(v == next_avail + 1);
            inflight[v] = 1; n++; next_avail++;
            assert(n <= L);     /* never more than L taken, not completed */
            printf("device    takes request %d, %d outstanding\n", v, n);
            v = 0
        };
        if
        :: n == L && (sqf & THROTTLE) == 0 ->
            sqf = sqf | THROTTLE;
            store(DEV, SQ_FLAGS, sqf)
#ifdef NO_T1
        :: n < L && (sqf & THROTTLE) != 0 ->
            sqf = sqf & ~THROTTLE;
            store(DEV, SQ_FLAGS, sqf)
#endif
        :: else -> skip
        fi
    :: else -> break
    od;
    a = 0;
    goto poll;

complete:
    atomic {
        /* the first request from a random one on that is in flight */
        select(i : 1 .. N);
        do
        :: !inflight[i] -> i = i % N + 1
        :: else -> break
        od;
        inflight[i] = 0;
        n--;
        completed[i]++;
        assert(completed[i] == 1);
        mem[USED_RING + used] = i;
        printf("device    completes request %d, used.ring[%d], %d outstanding\n", i, used, n);
        used++;
        i = 0; j = 0
    };
#ifndef NO_T2_ORDER
    if                          /* T2: the clear before the publication */
    :: (sqf & THROTTLE) != 0 && n <= LOW ->
        sqf = sqf & ~THROTTLE;
        store(DEV, SQ_FLAGS, sqf)
    :: else -> skip
    fi;
#endif
    store(DEV, USED_IDX, used);
    store(DEV, CQ_IDX, used);
    fence(DEV);
    load(DEV, CQ_FLAGS, f);
    if
    :: (f & NEED_WAKEUP) != 0 -> notify(call, DEV)
    :: else -> skip
    fi;
    f = 0;
#ifdef NO_T2_ORDER
    if                          /* the clear after the publication */
    :: (sqf & THROTTLE) != 0 && n <= LOW ->
        sqf = sqf & ~THROTTLE;
        store(DEV, SQ_FLAGS, sqf)
    :: else -> skip
    fi;
#endif
#ifdef NO_T3
    goto poll;                  /* waits for sq.idx to change */
#else
    goto relook;                /* T3: looks at the ring again */
#endif

prepare_sleep:
    store(DEV, SQ_FLAGS, sqf | NEED_WAKEUP);
    fence(DEV);
    load(DEV, SQ_IDX, v);
    if
    :: v != last_sq ->
        store(DEV, SQ_FLAGS, sqf);
        goto work
    :: else -> skip
    fi;
    if
    :: next_avail == N ->
end_idle:   WAIT(kick, DEV)     /* legitimate: every request taken */
    :: else ->
            WAIT(kick, DEV)     /* a request is still owed: must be woken */
    fi;
    store(DEV, SQ_FLAGS, sqf);
    goto poll
}

/*
 * Driver poll thread, CQ consumer: polls cq.idx, harvests the used ring,
 * stores its harvested count, [fence (6)], reads sq.flags (D2), then the
 * held record (D3), and releases the submitter if THROTTLE is clear or
 * nothing is outstanding. Sleeps as in need_wakeup.pml.
 */
active proctype poller() {
    byte last_cq;           /* last cq.idx value seen */
    byte harvested;         /* used ring entries consumed */
    byte v, u, f, h, pub;

poll:
    load(DRV, CQ_IDX, v);
    if
    :: v != last_cq -> goto work
    :: else ->
        if
        :: goto poll
        :: goto prepare_sleep
        fi
    fi;

work:
    last_cq = v;
    v = 0;
#ifdef NO_D2
    load(DRV, SQ_FLAGS, f);     /* before it consumes: can miss a clear */
#endif
    load(DRV, USED_IDX, u);
    assert(u >= last_cq);       /* cq.idx is never ahead of used.idx */
    if
    :: u == harvested -> f = 0; goto poll
    :: else -> skip
    fi;
    d_step {                    /* harvests the used ring up to u */
        do
        :: harvested != u ->
            v = mem[USED_RING + harvested];
            assert(v >= 1 && v <= N);
            assert(completed[v] == 1);
            seen[v]++;
            nseen++;
            assert(seen[v] == 1);   /* each request harvested once */
            harvested++
        :: else -> break
        od;
        v = 0; u = 0
    };
    store(DRV, HARV, harvested);
    FENCE_6;
#ifndef NO_D2
    load(DRV, SQ_FLAGS, f);
#endif
    load(DRV, HELD, h);
    if
    :: h != 0 ->
        load(DRV, AVAIL_IDX, pub);    /* requests published */
        if
#ifdef NO_D1
        :: (f & THROTTLE) == 0 -> notify(release, DRV)
#else
        :: (f & THROTTLE) == 0 || pub == harvested -> notify(release, DRV)
#endif
        :: else -> skip
        fi
    :: else -> skip
    fi;
    f = 0; h = 0; pub = 0;
    goto poll;

prepare_sleep:
    store(DRV, CQ_FLAGS, NEED_WAKEUP);
    fence(DRV);
    load(DRV, CQ_IDX, v);
    if
    :: v != last_cq ->
        store(DRV, CQ_FLAGS, 0);
        goto work
    :: else -> skip
    fi;
    if
    :: harvested == N ->
end_idle:   WAIT(call, DRV)     /* legitimate: every completion harvested */
    :: else ->
            WAIT(call, DRV)     /* a completion is still owed */
    fi;
    store(DRV, CQ_FLAGS, 0);
    goto poll
}

#ifdef LIVENESS
/* Under weak fairness every request is eventually harvested. */
ltl all_harvested { <> (nseen == N) }
#endif
