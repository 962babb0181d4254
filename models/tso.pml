/*
 * TSO (x86) shared memory with one FIFO store buffer per thread, and
 * eventfds: the machinery the VIRTIO_F_SQCQ_POLL models of this directory
 * share. The including model defines N (requests) and SBSZ (store buffer
 * entries per thread) first, and may define NEXTRA, the number of memory
 * locations of its own after the rings (driver-internal variables shared
 * by the driver's two threads), with PR_EXTRA(l) to print their names.
 *
 * Three threads own a store buffer: the submitter (driver, SQ producer),
 * the device (SQ consumer and CQ producer) and the poller (driver, CQ
 * consumer). A store goes into the storing thread's buffer; a load returns
 * the thread's own newest buffered store to that location, else memory;
 * `memory` moves the oldest buffered store of any thread to memory at any
 * time; fence(SeqCst) blocks until the thread's buffer is empty. Acquire
 * and release orderings are free under TSO and need no modelling.
 */

/* Memory locations. Ring slots hold request ids 1..N; 0 is "empty". */
#define AVAIL_IDX   0
#define SQ_IDX      1
#define SQ_FLAGS    2
#define USED_IDX    3
#define CQ_IDX      4
#define CQ_FLAGS    5
#define AVAIL_RING  6
#define USED_RING   (AVAIL_RING + N)
#ifndef NEXTRA
#define NEXTRA      0
#endif
#define EXTRA       (USED_RING + N)     /* the including model's own locations */
#define NLOC        (EXTRA + NEXTRA)
#ifndef PR_EXTRA
#define PR_EXTRA(l) printf("extra[%d]", (l) - EXTRA)
#endif

#define NEED_WAKEUP 1               /* bit 0 of sq.flags and of cq.flags */
#define THROTTLE    2               /* bit 1 of sq.flags (throttle.pml) */

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
    :: l >= USED_RING && l < EXTRA -> printf("used.ring[%d]", l - USED_RING)
    :: l >= EXTRA -> PR_EXTRA(l)
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

active proctype memory() {
end:
    do
    :: drain(SUB)
    :: drain(DEV)
    :: drain(DRV)
    od
}
