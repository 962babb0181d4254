/*
 * VIRTIO_F_SQCQ_POLL: a virtqueue with doorbells stops and starts again
 * (docs/spec/virtio-sqcq.md, section 8.3). The device instance serving it
 * is stopped (vhost-user GET_VRING_BASE) or killed (kill -9) at any point,
 * and a new instance, which may find requests in the vhost-user in-flight
 * area, takes over while the driver goes on unchanged.
 *
 *   submitter  driver thread, SQ producer: publishes N requests
 *   device     the device poll thread of one instance after another: SQ
 *              consumer and CQ producer; completes requests out of order,
 *              up to BATCH used elements per used.idx store; is stopped or
 *              killed RESTARTS times in all
 *   poller     driver poll thread, CQ consumer
 *   memory     drains store buffers to memory (tso.pml)
 *
 * The submitter and the poller follow need_wakeup.pml. The device follows
 * spec 8.3: stop S1-S5, start R1-R3. Each rule of the start can be left
 * out (the first instance's start is the ordinary one of spec 8.1):
 *   -DNO_START_RECONCILE  R1: requests of a batch whose used.idx store
 *                             reached memory still count as in flight
 *   -DLAST_HEAD_ONLY      R1 with I2 as libvhost-user has it: only the
 *                             request added to the batch last is known
 *   -DNO_START_CQ_IDX     R2: cq.idx is not rewritten from used.idx
 *   -DNO_START_FENCE      R2: no fence between the cq.idx store and the
 *                             cq.flags load
 *   -DNO_START_CALL       R2: no call when cq.flags has NEED_WAKEUP
 *   -DNO_START_RESCAN     R3: waits for sq.idx to change instead of
 *                             taking what is on the ring from its position
 * Each variant must fail. -DNO_STOP_WAKEUP leaves out S3 (NEED_WAKEUP in
 * sq.flags at the stop) and must verify: the start does not rely on it.
 *
 * Ring entries (avail.ring, used.ring) are written straight to memory,
 * before the index store that publishes them. Under TSO a thread that sees
 * an index sees every entry stored before it, and no thread reads an entry
 * beyond the index it saw, so when an entry reaches memory cannot be
 * observed; the store buffers carry the indices and the doorbells.
 */

#ifndef N
#define N 2                 /* requests the submitter publishes */
#endif
#ifndef SBSZ
#define SBSZ 4              /* store buffer entries per thread */
#endif
#ifndef BATCH
#define BATCH 2             /* used elements per used.idx store, at most */
#endif
#ifndef RESTARTS
#define RESTARTS 1          /* stops and kills, in all */
#endif

#include "tso.pml"

byte seen[N + 1];           /* per request id: harvests by the poller */
byte nseen;                 /* requests harvested, for the liveness claim */

/*
 * The in-flight area (vhost-user VHOST_USER_SET_INFLIGHT_FD): memory the
 * front-end keeps and hands to the next instance. Only a device reads it,
 * and only after the instance that wrote it is gone and its stores are in
 * memory, so its stores need no store buffer.
 */
bit inf[N + 1];             /* per request id: taken, not yet completed */
bit inf_batch[N + 1];       /* per request id: in the batch being published */
byte inf_used;              /* used.idx before that batch */
#ifdef LAST_HEAD_ONLY
byte inf_head;              /* the request added to the batch last */
#endif

bit restarted;              /* the running instance is not the first */
byte events;                /* stops and kills so far, RESTARTS at most */
#define NO_BASE 255
byte vbase = NO_BASE;       /* the answer to GET_VRING_BASE; NO_BASE after a kill */

/* Driver thread, SQ producer: entry and avail.idx, sq.idx, fence (1), sq.flags. */
active proctype submitter() {
    byte k = 1;
    byte f;

    do
    :: k <= N ->
        atomic { mem[AVAIL_RING + k - 1] = k; store(SUB, AVAIL_IDX, k) };
        store(SUB, SQ_IDX, k);
        fence(SUB);
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
 * A kill can take the device between any two of its steps. Only its
 * stores, its eventfd writes and its in-flight area writes change what
 * the others see (a load does not), so a kill right after each of them
 * stands for every kill: KILLABLE follows each one. The kill takes effect
 * once the instance's buffered stores are in memory: a killed process's
 * stores still reach memory, and until they have, nothing tells a dead
 * instance from one that has not been scheduled. A stop (GET_VRING_BASE)
 * is seen where the device looks for it: before it polls, and while it
 * sleeps.
 */
#define KILLABLE \
    if \
    :: events < RESTARTS && sb_n[DEV] == 0 -> \
        events++; printf("device    killed\n"); goto handover \
    :: skip \
    fi

#define STOP_SEEN d_step { events++; halt = 1; printf("device    GET_VRING_BASE\n") }

inline dstore(l, x) {
    store(DEV, l, x);
    KILLABLE
}

/*
 * Device poll thread, one instance after another: polls sq.idx, takes
 * requests from the avail ring into the in-flight area, completes them out
 * of order in batches, sleeps on the kick eventfd, stops on GET_VRING_BASE
 * (S1-S5), dies when killed; the next instance starts with R1-R3.
 */
active proctype device() {
    byte last_sq;           /* last sq.idx value seen */
    byte next_avail;        /* next avail ring index to take */
    byte used;              /* used.idx published so far */
    byte n;                 /* requests in flight */
    byte b;                 /* used elements in the batch */
    bit halt;               /* GET_VRING_BASE seen: stopping */
    byte v, a, f, i, j;

instance:
    if
    :: !restarted ->
        /* Spec 8.1: the first start, from ring base 0, looks at the ring
         * without waiting for sq.idx to change. */
        load(DEV, SQ_IDX, v);
        goto work
    :: else -> skip
    fi;

    /*
     * R1. Reconciles the in-flight area with used.idx: if used.idx is no
     * longer the value before the last batch, that batch was published
     * and its requests are complete. The other requests recorded stay in
     * flight (they are resubmitted); the next avail index is used.idx
     * plus their number.
     */
    d_step {
        assert(sb_n[DEV] == 0); /* so reading memory is a load */
        used = mem[USED_IDX];
        i = 1;
        do
        :: i <= N ->
#if !defined(NO_START_RECONCILE) && !defined(LAST_HEAD_ONLY)
            if
            :: inf_batch[i] && inf_used != used -> inf[i] = 0
            :: else -> skip
            fi;
#endif
#ifdef LAST_HEAD_ONLY
            if
            :: i == inf_head && inf_used != used -> inf[i] = 0
            :: else -> skip
            fi;
#endif
            inf_batch[i] = 0;
            if
            :: inf[i] -> n++
            :: else -> skip
            fi;
            i++
        :: else -> break
        od;
        i = 0;
        inf_used = used;
        next_avail = used + n;
        printf("device    starts: used.idx %d, %d in flight, next avail %d\n",
               used, n, next_avail)
    };
    /* After GET_VRING_BASE, the area and the answer agree. */
    assert(vbase == NO_BASE || vbase == next_avail);
    vbase = NO_BASE;

    /*
     * R2. cq.idx = used.idx (the old instance may have died between the
     * two stores), fence, cq.flags, call if NEED_WAKEUP (it may have died
     * before it read cq.flags).
     */
#ifndef NO_START_CQ_IDX
    dstore(CQ_IDX, used);
#endif
#ifndef NO_START_FENCE
    fence(DEV);
#endif
    load(DEV, CQ_FLAGS, f);
#ifndef NO_START_CALL
    if
    :: (f & NEED_WAKEUP) != 0 -> notify(call, DEV); KILLABLE
    :: else -> skip
    fi;
#endif
    f = 0;

    /*
     * R3. Clears NEED_WAKEUP, fence, then takes every entry from
     * next_avail on, whatever sq.idx says.
     */
    dstore(SQ_FLAGS, 0);
    fence(DEV);
#ifdef NO_START_RESCAN
    load(DEV, SQ_IDX, last_sq);
    goto poll;
#else
    load(DEV, SQ_IDX, v);
    goto work;
#endif

poll:
    if
    :: halt -> goto stopping
    :: !halt && events < RESTARTS -> STOP_SEEN; goto stopping
    :: !halt -> skip
    fi;
    load(DEV, SQ_IDX, v);
    if
    :: v != last_sq -> goto work
    :: else -> v = 0;
        if
        :: n > 0 -> goto complete
        :: else ->
            if
            :: goto poll            /* spin window not over yet */
            :: goto prepare_sleep   /* spin window over */
            fi
        fi
    fi;

work:
    last_sq = v;
    v = 0;
    load(DEV, AVAIL_IDX, a);
    assert(a >= last_sq);       /* sq.idx is never ahead of avail.idx */
    do
    :: next_avail < a ->
        d_step {                /* takes the entry, records it in flight */
            v = mem[AVAIL_RING + next_avail];
            assert(v == next_avail + 1);
            inf[v] = 1; n++; next_avail++;
            printf("device    takes request %d, in flight\n", v);
            v = 0
        };
        KILLABLE
    :: else -> break
    od;
    a = 0;
    goto poll;

    /*
     * Completes requests in flight, any of them, in any order. P1: the
     * area marks each one as in the batch (it holds the used.idx before
     * the batch already) and its used element is written, up to BATCH.
     * P2-P6: one used.idx store publishes them. Then they leave the area.
     */
complete:
    atomic {
        do
        :: b < BATCH ->
            /* the first request from a random one on that is in flight
             * and not yet in the batch */
            select(i : 1 .. N);
            do
            :: j < N && !(inf[i] && !inf_batch[i]) -> i = i % N + 1; j++
            :: j < N && inf[i] && !inf_batch[i] -> break
            :: j == N -> i = 0; break
            od;
            j = 0;
            if
            :: i == 0 -> break
            :: else -> skip
            fi;
            assert(used + b < N);       /* no request is published twice */
            inf_batch[i] = 1;
#ifdef LAST_HEAD_ONLY
            inf_head = i;
#endif
            mem[USED_RING + used + b] = i;
            printf("device    used.ring[%d] = %d, in the batch\n", used + b, i);
            b++;
            i = 0;
            if
            :: break                    /* publish now */
            :: skip                     /* another one in this batch */
            fi
        :: else -> break
        od;
        i = 0;
        assert(b > 0);
        used = used + b;
        b = 0
    };
    KILLABLE;
    dstore(USED_IDX, used);
    dstore(CQ_IDX, used);
    fence(DEV);
    load(DEV, CQ_FLAGS, f);
    if
    :: (f & NEED_WAKEUP) != 0 -> notify(call, DEV); KILLABLE
    :: else -> skip
    fi;
    f = 0;
    d_step {
        i = 1;
        do
        :: i <= N ->
            if
            :: inf_batch[i] -> inf[i] = 0; inf_batch[i] = 0; n--
            :: else -> skip
            fi;
            i++
        :: else -> break
        od;
        i = 0;
        inf_used = used;
        printf("device    the batch leaves the in-flight area\n")
    };
    KILLABLE;
    goto poll;

prepare_sleep:
    dstore(SQ_FLAGS, NEED_WAKEUP);
    fence(DEV);
    load(DEV, SQ_IDX, v);
    if
    :: v != last_sq ->
        dstore(SQ_FLAGS, 0);
        goto work
    :: else -> v = 0
    fi;
    if
    :: next_avail == N ->
end_idle:
        if                      /* legitimate: every request taken */
        :: WAIT(kick, DEV)
        :: events < RESTARTS -> STOP_SEEN; goto stopping
        fi
    :: else ->
        if                      /* a request is still owed: must be woken */
        :: WAIT(kick, DEV)
        :: events < RESTARTS -> STOP_SEEN; goto stopping
        fi
    fi;
    KILLABLE;                   /* it has read the kick eventfd */
    dstore(SQ_FLAGS, 0);
    goto poll;

    /*
     * S1: takes no new request (it does not poll again); completes what
     * is in flight, each publication whole (S2), or, past its deadline,
     * leaves it recorded in the area.
     */
stopping:
    if
    :: n > 0 -> goto complete
    :: skip
    fi;
#ifndef NO_STOP_WAKEUP
    dstore(SQ_FLAGS, NEED_WAKEUP);      /* S3 */
#endif
    /* S4 is not modelled: memory is shared, not copied. The answer to
     * GET_VRING_BASE is a system call, after which the instance's stores
     * are in memory; then S5: it touches nothing more. */
    fence(DEV);
    d_step { vbase = next_avail; printf("device    stopped at %d\n", vbase) };

    /*
     * Stopped, or killed, with all its stores in memory. The front-end
     * starts the next instance with the same in-flight area. A kick or
     * call in transit may be lost with its eventfd (a migration sets up
     * new ones).
     */
handover:
    atomic {
        if
        :: skip
        :: kick = 0; call = 0; printf("front-end kick and call eventfds replaced\n")
        fi;
        restarted = 1; halt = 0;
        last_sq = 0; next_avail = 0; used = 0; n = 0; b = 0;
        v = 0; a = 0; f = 0; i = 0; j = 0
    };
    goto instance
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
    d_step {                    /* harvests the used ring up to u */
        do
        :: harvested != u ->
            id = mem[USED_RING + harvested];
            assert(id >= 1 && id <= N);
            seen[id]++;
            nseen++;
            assert(seen[id] == 1);  /* each request harvested once */
            harvested++
        :: else -> break
        od;
        id = 0
    };
    u = 0;
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
