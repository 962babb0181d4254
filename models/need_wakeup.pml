/*
 * VIRTIO_F_SQCQ_POLL: the NEED_WAKEUP handshake in both directions, under
 * TSO (x86) memory, with one store buffer per thread.
 *
 *   submitter  driver thread, SQ producer: publishes N requests
 *   device     device poll thread, SQ consumer and CQ producer
 *   poller     driver poll thread, CQ consumer
 *   memory     drains store buffers to memory, oldest store first
 *
 * tso.pml has the memory model (stores, loads, fences, store buffers
 * drained by `memory`) and the eventfds.
 *
 * The four store -> fence(SeqCst) -> load points of the protocol can be
 * left out one at a time:
 *   -DNO_FENCE_SQ_PRODUCER  (1) submitter: sq.idx store  -> sq.flags load
 *   -DNO_FENCE_SQ_CONSUMER  (2) device:    sq.flags store -> sq.idx load
 *   -DNO_FENCE_CQ_PRODUCER  (3) device:    cq.idx store  -> cq.flags load
 *   -DNO_FENCE_CQ_CONSUMER  (4) poller:    cq.flags store -> cq.idx load
 * Each variant must fail: a thread sleeps forever while work is owed to it,
 * which pan reports as an invalid end state.
 */

#ifndef N
#define N 3                 /* requests the submitter publishes */
#endif
#ifndef SBSZ
#define SBSZ 4              /* store buffer entries per thread */
#endif

#include "tso.pml"

byte completed[N + 1];      /* per request id: completions by the device */
byte seen[N + 1];           /* per request id: harvests by the poller */
byte nseen;                 /* requests harvested, for the liveness claim */

#ifdef NO_FENCE_SQ_PRODUCER
#define FENCE_SQ_PRODUCER skip
#else
#define FENCE_SQ_PRODUCER fence(SUB)
#endif
#ifdef NO_FENCE_SQ_CONSUMER
#define FENCE_SQ_CONSUMER skip
#else
#define FENCE_SQ_CONSUMER fence(DEV)
#endif
#ifdef NO_FENCE_CQ_PRODUCER
#define FENCE_CQ_PRODUCER skip
#else
#define FENCE_CQ_PRODUCER fence(DEV)
#endif
#ifdef NO_FENCE_CQ_CONSUMER
#define FENCE_CQ_CONSUMER skip
#else
#define FENCE_CQ_CONSUMER fence(DRV)
#endif

/* Driver thread, SQ producer: entry, avail.idx, sq.idx, fence (1), sq.flags. */
active proctype submitter() {
    byte k = 1;
    byte f;

    do
    :: k <= N ->
        store(SUB, AVAIL_RING + k - 1, k);
        store(SUB, AVAIL_IDX, k);
        store(SUB, SQ_IDX, k);
        FENCE_SQ_PRODUCER;
        load(SUB, SQ_FLAGS, f);
        if
        :: (f & NEED_WAKEUP) != 0 -> notify(kick, SUB)
        :: else -> skip
        fi;
        f = 0;
        k++
    :: else -> break
    od
}

/*
 * Device poll thread. SQ consumer: polls sq.idx, takes work from the avail
 * ring, sets sq.flags NEED_WAKEUP, fence (2), re-reads sq.idx before it
 * sleeps on the kick eventfd. CQ producer: used entry, used.idx, cq.idx,
 * fence (3), cq.flags, call if NEED_WAKEUP.
 */
active proctype device() {
    byte last_sq;           /* last sq.idx value seen */
    byte next_avail;        /* next avail ring index to consume */
    byte used;              /* used.idx published so far */
    byte v, a, id, f;

poll:
    load(DEV, SQ_IDX, v);
    if
    :: v != last_sq -> goto work
    :: else ->
        if
        :: goto poll            /* spin window not over yet */
        :: goto prepare_sleep   /* spin window over */
        fi
    fi;

work:
    last_sq = v;
    v = 0;
    load(DEV, AVAIL_IDX, a);
    assert(a >= last_sq);       /* sq.idx is never ahead of avail.idx */
    do
    :: next_avail != a ->
        load(DEV, AVAIL_RING + next_avail, id);
        assert(id == next_avail + 1);
        next_avail++;
        completed[id]++;
        assert(completed[id] == 1);
        store(DEV, USED_RING + used, id);
        used++;
        store(DEV, USED_IDX, used);
        store(DEV, CQ_IDX, used);
        FENCE_CQ_PRODUCER;
        load(DEV, CQ_FLAGS, f);
        if
        :: (f & NEED_WAKEUP) != 0 -> notify(call, DEV)
        :: else -> skip
        fi;
        f = 0;
        id = 0
    :: else -> break
    od;
    a = 0;
    goto poll;

prepare_sleep:
    store(DEV, SQ_FLAGS, NEED_WAKEUP);
    FENCE_SQ_CONSUMER;
    load(DEV, SQ_IDX, v);
    if
    :: v != last_sq ->
        store(DEV, SQ_FLAGS, 0);
        goto work
    :: else -> skip
    fi;
    if
    :: next_avail == N ->
end_idle:   WAIT(kick, DEV)     /* legitimate: every request consumed */
    :: else ->
            WAIT(kick, DEV)     /* a request is still owed: must be woken */
    fi;
    store(DEV, SQ_FLAGS, 0);
    goto poll
}

/*
 * Driver poll thread, CQ consumer: polls cq.idx, harvests the used ring,
 * sets cq.flags NEED_WAKEUP, fence (4), re-reads cq.idx before it sleeps
 * on the call eventfd.
 */
active proctype poller() {
    byte last_cq;           /* last cq.idx value seen */
    byte harvested;         /* used ring entries consumed */
    byte v, u, id;

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
    load(DRV, USED_IDX, u);
    assert(u >= last_cq);       /* cq.idx is never ahead of used.idx */
    do
    :: harvested != u ->
        load(DRV, USED_RING + harvested, id);
        assert(id >= 1 && id <= N);
        assert(completed[id] == 1);
        d_step { seen[id]++; nseen++ };
        assert(seen[id] == 1);
        harvested++;
        id = 0
    :: else -> break
    od;
    u = 0;
    goto poll;

prepare_sleep:
    store(DRV, CQ_FLAGS, NEED_WAKEUP);
    FENCE_CQ_CONSUMER;
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
