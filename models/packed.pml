/*
 * VIRTIO_F_SQCQ_POLL on a packed virtqueue (docs/spec/virtio-sqcq.md,
 * section 10): the NEED_WAKEUP handshake of one doorbell, under TSO (x86)
 * memory, with one store buffer per thread (tso.pml).
 *
 * A packed virtqueue has one ring of Q descriptors and no ring index. A
 * side finds the other's work by the AVAIL and USED flags of the
 * descriptor at its own next position, and counts its laps with a wrap
 * counter. The doorbell's idx holds the producer's next position: the
 * offset, and the wrap counter in the top bit (0x8000 in the spec, 0x80 =
 * 128 in this model's bytes), so a value repeats every two laps.
 *
 *   producer   publishes N entries: waits until the descriptor at its
 *              position is free (the consumer took what it held a lap
 *              ago), stores its flags (P1) and moves its position on, for
 *              one entry or a batch of them; then stores idx = its
 *              position (P3), fence, loads flags (P5) and notifies if
 *              NEED_WAKEUP (P6)
 *   consumer   polls idx (C1: a value that differs from its own position
 *              sends it to the ring) or the ring itself, and takes each
 *              entry whose descriptor flags say so, by its wrap counter;
 *              marks the descriptor taken. To sleep: stores NEED_WAKEUP
 *              (C3), fence (C4), loads the flags of the descriptor at its
 *              own position (C5) and sleeps unless that descriptor is
 *              ready, until notified (C6)
 *   memory     drains store buffers to memory (tso.pml)
 *
 * The doorbell is the SQ by default: the producer is the driver's
 * submitter, which makes descriptors available (AVAIL = its wrap counter,
 * USED = the opposite); the consumer is the device, which takes an
 * available descriptor and writes it back used (AVAIL = USED = its wrap
 * counter), as a device that uses descriptors in order does. With -DCQ
 * it is the CQ: the producer is the device, which writes used descriptors
 * into descriptors the driver made available; the consumer is the
 * driver's poller, which takes each used descriptor and makes its buffer
 * available again one lap ahead. All Q buffers are available at the
 * start. The producer learns that a descriptor is free from its flags
 * alone (it waits on them, without a doorbell of its own): only one
 * doorbell's handshake is modelled.
 *
 * Left out, each must fail (a consumer asleep for ever while an entry is
 * ready at its position: an invalid end state):
 *   -DNO_FENCE_PRODUCER  fence 1 (SQ) or 3 (CQ): idx store -> flags load
 *   -DNO_FENCE_CONSUMER  fence 2 (SQ) or 4 (CQ): flags store -> the load
 *                        of the descriptor flags
 *   -DRECHECK_IDX_LAST   C5 loads idx and compares it with the last idx
 *                        value it acted on, as on a split ring, instead of
 *                        loading the descriptor flags: a producer exactly
 *                        two laps further on reads as no change (10.5)
 * -DNO_BATCH: the producer publishes each entry on its own (P3 to P6).
 * And one that verifies (a claim, run by hand):
 *   -DRECHECK_IDX_POS    C5 loads idx and compares it with its own
 *                        position: with a producer that is never more than
 *                        a ring ahead, that does not alias
 */

#ifndef N
#define N 6                 /* entries the producer publishes: three laps */
#endif
#ifndef Q
#define Q 2                 /* descriptors in the ring (queue size) */
#endif
#ifndef SBSZ
#define SBSZ 4              /* store buffer entries per thread */
#endif

/* The descriptor flags, one location per descriptor, after the rings. */
#define NEXTRA Q
#define DESC EXTRA
#define PR_EXTRA(l) printf("desc[%d].flags", (l) - DESC)

#include "tso.pml"

#if SBSZ > 4
#error "UNBUFFERED looks at 4 store buffer entries at most"
#endif

/* A position: the offset, and the wrap counter in the top bit. */
#define WRAP_BIT 128
#define POS(o, w) ((o) + WRAP_BIT * (w))

/*
 * Descriptor flags (VIRTQ_DESC_F_AVAIL and VIRTQ_DESC_F_USED, bits 7 and
 * 15 in the spec, 1 and 2 here) as written at wrap counter w.
 */
#define F_AVAIL 1
#define F_USED  2
#define AVAIL_FLAGS(w) ((w) * F_AVAIL + (1 - (w)) * F_USED)  /* AVAIL = w, USED = !w */
#define USED_FLAGS(w)  ((w) * (F_AVAIL + F_USED))            /* AVAIL = USED = w */

#ifdef CQ
/* Device -> driver: the device writes used descriptors into available
 * ones; the driver takes them and makes each buffer available again. */
#define PRODUCER device
#define CONSUMER poller
#define PRO DEV
#define CON DRV
#define IDX CQ_IDX
#define FLAGS CQ_FLAGS
#define EFD call
#define PRODUCED(w) USED_FLAGS(w)
#define FREE(w)     AVAIL_FLAGS(w)
#define TAKEN(w)    AVAIL_FLAGS(1 - (w))    /* the driver's avail position is a lap ahead */
#define INIT_FLAGS  AVAIL_FLAGS(1)          /* every buffer available before the start */
#else
/* Driver -> device: the driver makes descriptors available; the device
 * takes them and writes them back used, in order. */
#define PRODUCER submitter
#define CONSUMER device
#define PRO SUB
#define CON DEV
#define IDX SQ_IDX
#define FLAGS SQ_FLAGS
#define EFD kick
#define PRODUCED(w) AVAIL_FLAGS(w)
#define FREE(w)     USED_FLAGS(1 - (w))     /* used on the previous lap */
#define TAKEN(w)    USED_FLAGS(w)
#define INIT_FLAGS  0                       /* a zeroed ring: "used at wrap 0" */
#endif

#ifdef NO_FENCE_PRODUCER
#define FENCE_PRODUCER skip
#else
#define FENCE_PRODUCER fence(PRO)
#endif
#ifdef NO_FENCE_CONSUMER
#define FENCE_CONSUMER skip
#else
#define FENCE_CONSUMER fence(CON)
#endif

byte produced;              /* entries the producer made ready (ghost) */
byte consumed;              /* entries the consumer took (ghost) */

/* p has no store to l in its store buffer, so a load reads memory. */
#define UNBUFFERED(p, l) \
    ((sb_n[p] < 1 || sb_loc[(p) * SBSZ] != (l)) && \
     (sb_n[p] < 2 || sb_loc[(p) * SBSZ + 1] != (l)) && \
     (sb_n[p] < 3 || sb_loc[(p) * SBSZ + 2] != (l)) && \
     (sb_n[p] < 4 || sb_loc[(p) * SBSZ + 3] != (l)))

/*
 * Load l until it reads v. One step: the loads that read another value
 * change nothing, so they are left out, and a producer that waits for
 * ever is blocked, not spinning (pan then reports the deadlock).
 */
inline await_free(p, l, v) {   /* the ring is full: waits for the consumer */
    d_step {
        UNBUFFERED(p, l) && mem[l] == v;
        pr_thr(p); printf(" load  "); pr_loc(l); printf(" -> %d (free)\n", v)
    }
}

/* Move a position (o, w) on by one descriptor. */
inline advance(o, w) {
    if
    :: o + 1 < Q -> o++
    :: else -> o = 0; w = 1 - w
    fi
}

init {
    byte i;
    /* Before the virtqueue is enabled (spec 10.3): idx is 0x8000 on both
     * doorbells; on a CQ every buffer is already available. */
    d_step {
        mem[SQ_IDX] = POS(0, 1);
        mem[CQ_IDX] = POS(0, 1);
        i = 0;
        do
        :: i < Q -> mem[DESC + i] = INIT_FLAGS; i++
        :: else -> break
        od;
        i = 0
    };
    atomic { run PRODUCER(); run CONSUMER() }
}

/*
 * P1 (flags), P3 (idx = next position), fence (P4), P5, P6. A batch: it
 * may make the next entry ready before P3, if it finds the next
 * descriptor free already (it never waits for one with entries it has not
 * published, or it could wait for a consumer that sleeps).
 */
proctype PRODUCER() {
    byte off;               /* its next position: offset */
    bit wrap = 1;           /* and wrap counter */
    byte f;

    do
    :: produced < N ->
        await_free(PRO, DESC + off, FREE(wrap));
        do
        :: d_step {
                assert(produced - consumed < Q);    /* overwrites nothing untaken */
                produced++
            };
            store(PRO, DESC + off, PRODUCED(wrap));         /* P1 */
            advance(off, wrap);
            if
#ifndef NO_BATCH
            :: produced < N ->                      /* one more in the batch? */
                load(PRO, DESC + off, f);
                if
                :: f == FREE(wrap) -> f = 0
                :: else -> f = 0; break
                fi
#endif
            :: break
            fi
        od;
        store(PRO, IDX, POS(off, wrap));                    /* P3 */
        FENCE_PRODUCER;                                     /* P4 */
        load(PRO, FLAGS, f);                                /* P5 */
        if
        :: (f & NEED_WAKEUP) != 0 -> notify(EFD, PRO)       /* P6 */
        :: else -> skip
        fi;
        f = 0
    :: else -> break
    od
}

proctype CONSUMER() {
    byte off;               /* its next position: offset */
    bit wrap = 1;           /* and wrap counter */
    byte v, f;
#ifdef RECHECK_IDX_LAST
    byte last = POS(0, 1);  /* the idx value it last acted on */
#endif

poll:
    if
    :: load(CON, IDX, v);   /* C1: idx is a hint */
        if
        :: v != POS(off, wrap) ->
#ifdef RECHECK_IDX_LAST
            last = v;
#endif
            v = 0;
            goto look
        :: else -> v = 0; goto idle
        fi
    :: goto look            /* polls the ring, without idx */
    fi;

look:                       /* C2: the descriptor at its position decides */
    load(CON, DESC + off, f);
    if
    :: f == PRODUCED(wrap) -> f = 0
    :: else -> f = 0; goto idle
    fi;
    d_step {
        assert(consumed < produced);    /* takes only what was made ready */
        consumed++
    };
    store(CON, DESC + off, TAKEN(wrap));
    advance(off, wrap);
    goto look;

idle:
    if
    :: goto poll            /* spin window not over yet */
    :: goto prepare_sleep   /* spin window over */
    fi;

prepare_sleep:
    store(CON, FLAGS, NEED_WAKEUP);     /* C3 */
    FENCE_CONSUMER;                     /* C4 */
#if defined(RECHECK_IDX_LAST)
    load(CON, IDX, v);                  /* C5, as on a split ring */
    if
    :: v != last ->
        last = v;
        v = 0;
        store(CON, FLAGS, 0);
        goto look
    :: else -> v = 0
    fi;
#elif defined(RECHECK_IDX_POS)
    load(CON, IDX, v);                  /* C5, idx against its position */
    if
    :: v != POS(off, wrap) ->
        v = 0;
        store(CON, FLAGS, 0);
        goto look
    :: else -> v = 0
    fi;
#else
    load(CON, DESC + off, f);           /* C5: the flags at its position */
    if
    :: f == PRODUCED(wrap) ->
        f = 0;
        store(CON, FLAGS, 0);
        goto look                       /* and takes it */
    :: else -> f = 0
    fi;
#endif
    if
    :: consumed == N ->
end_idle:   WAIT(EFD, CON)      /* legitimate: every entry taken */
    :: else ->
            WAIT(EFD, CON)      /* an entry is still owed: must be woken */
    fi;
    store(CON, FLAGS, 0);       /* C7 */
    goto poll
}

#ifdef LIVENESS
/* Under weak fairness every entry is eventually taken. */
ltl all_taken { <> (consumed == N) }
#endif
