/*
 * VIRTIO_F_SQCQ_POLL: the NEED_WAKEUP handshake in both directions, under
 * TSO (x86) memory, with one store buffer per thread.
 *
 *   submitter  driver thread, SQ producer: publishes N requests
 *   device     device poll thread, SQ consumer and CQ producer
 *   poller     driver poll thread, CQ consumer
 *   memory     drains store buffers to memory, oldest store first
 *
 * A store goes into the storing thread's buffer; a load returns the
 * thread's own newest buffered store to that location, else memory;
 * `memory` moves the oldest buffered store of any thread to memory at any
 * time; fence(SeqCst) blocks until the thread's buffer is empty. Acquire
 * and release orderings are free under TSO and need no modelling.
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

/* Memory locations. Ring slots hold request ids 1..N; 0 is "empty". */
#define AVAIL_IDX   0
#define SQ_IDX      1
#define SQ_FLAGS    2
#define USED_IDX    3
#define CQ_IDX      4
#define CQ_FLAGS    5
#define AVAIL_RING  6
#define USED_RING   (AVAIL_RING + N)
#define NLOC        (USED_RING + N)

#define NEED_WAKEUP 1

/* Store buffer owners. */
#define SUB 0
#define DEV 1
#define DRV 2
#define NTHR 3

byte mem[NLOC];
byte sb_loc[NTHR * SBSZ];   /* per thread: SBSZ slots, oldest first */
byte sb_val[NTHR * SBSZ];
byte sb_n[NTHR];

byte kick;                  /* kick eventfd: driver -> device */
byte call;                  /* call eventfd: device -> driver */

byte completed[N + 1];      /* per request id: completions by the device */
byte seen[N + 1];           /* per request id: harvests by the poller */
byte nseen;                 /* requests harvested, for the liveness claim */

byte sbi;                   /* scratch inside d_step only: 0 between steps */

inline pr_thr(p) {
    if
    :: p == SUB -> printf("submitter")
    :: p == DEV -> printf("device   ")
    :: p == DRV -> printf("poller   ")
    fi
}

inline pr_loc(l) {
    if
    :: l == AVAIL_IDX -> printf("avail.idx")
    :: l == SQ_IDX    -> printf("sq.idx")
    :: l == SQ_FLAGS  -> printf("sq.flags")
    :: l == USED_IDX  -> printf("used.idx")
    :: l == CQ_IDX    -> printf("cq.idx")
    :: l == CQ_FLAGS  -> printf("cq.flags")
    :: l >= AVAIL_RING && l < USED_RING -> printf("avail.ring[%d]", l - AVAIL_RING)
    :: l >= USED_RING -> printf("used.ring[%d]", l - USED_RING)
    fi
}

/* Buffer a store; blocks while the buffer is full. */
inline store(p, l, v) {
    d_step {
        sb_n[p] < SBSZ;
        sb_loc[p * SBSZ + sb_n[p]] = l;
        sb_val[p * SBSZ + sb_n[p]] = v;
        sb_n[p]++;
        pr_thr(p); printf(" store "); pr_loc(l); printf(" = %d (buffered)\n", v)
    }
}

/* Load: the newest own buffered store to l, else memory. */
inline load(p, l, r) {
    d_step {
        r = mem[l];
        sbi = 0;
        do
        :: sbi < sb_n[p] ->
            if
            :: sb_loc[p * SBSZ + sbi] == l -> r = sb_val[p * SBSZ + sbi]
            :: else -> skip
            fi;
            sbi++
        :: else -> break
        od;
        sbi = 0;
        pr_thr(p); printf(" load  "); pr_loc(l); printf(" -> %d\n", r)
    }
}

/* fence(SeqCst): wait until every earlier store of p is in memory. */
inline fence(p) {
    d_step {
        sb_n[p] == 0;
        pr_thr(p); printf(" fence(SeqCst)\n")
    }
}

/* Move the oldest buffered store of p to memory. */
inline drain(p) {
    d_step {
        sb_n[p] > 0;
        mem[sb_loc[p * SBSZ]] = sb_val[p * SBSZ];
        printf("memory    "); pr_loc(sb_loc[p * SBSZ]);
        printf(" = %d (from ", sb_val[p * SBSZ]); pr_thr(p); printf(")\n");
        sbi = 0;
        do
        :: sbi + 1 < sb_n[p] ->
            sb_loc[p * SBSZ + sbi] = sb_loc[p * SBSZ + sbi + 1];
            sb_val[p * SBSZ + sbi] = sb_val[p * SBSZ + sbi + 1];
            sbi++
        :: else -> break
        od;
        sb_n[p]--;
        sb_loc[p * SBSZ + sb_n[p]] = 0;
        sb_val[p * SBSZ + sb_n[p]] = 0;
        sbi = 0
    }
}

/* eventfd write: add one to the counter. A system call, not a store. */
inline notify(efd, p) {
    d_step { efd++; pr_thr(p); printf(" notify\n") }
}

/* eventfd read: block while the counter is 0, then reset it to 0. */
#define WAIT(efd, p) d_step { efd > 0 -> efd = 0; pr_thr(p); printf(" woken\n") }

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

active proctype memory() {
end:
    do
    :: drain(SUB)
    :: drain(DEV)
    :: drain(DRV)
    od
}

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
