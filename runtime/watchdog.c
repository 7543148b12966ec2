/* runtime/watchdog.c: --timeout, and which rank a hung collective is waiting for.
 *
 * A thread that, while the main thread is inside a step (armed), checks a deadline every
 * 100 ms; past it, it says what hung and aborts every rank. It catches a peer that hangs
 * or stops without the launcher noticing (a deadlock, SIGSTOP); mpirun itself ends the
 * job when a rank exits or is killed.
 *
 * To name the rank to blame, every rank keeps a beacon in memory that the ranks of its
 * node all map (comm.c allocates them with MPI_Win_allocate_shared, Open MPI's osc/sm:
 * plain shared pages), so that a rank reads another's with plain loads, without the
 * other's help: a stopped process answers no message, but its pages stay readable. The
 * main thread writes its own beacon around each collective, a relaxed store or two and
 * no call into MPI: before starting one, its sequence number and plan op (the collectives
 * of MPI_COMM_WORLD run in the same order on every rank, so the k-th is the same
 * collective everywhere); before waiting for one, which one; after, none. The watchdog
 * thread adds a heartbeat every tick, so a rank that no longer runs at all (stopped, or
 * dead) is told from one that runs but is elsewhere.
 *
 * When the deadline passes while this rank waits in collective k, the message names k's
 * plan op (and its .fsm line: a collective that a pass added borrows the line of the op
 * whose data it moves) and the collective that holds k up: the earliest one that a
 * running rank waits in (k itself, or one before it: every rank runs them in order, so a
 * later one waits behind it). For that one, each rank's beacon says where the rank is:
 * it did not reach it (has not started it), started it and then stopped running (no
 * heartbeat), started it but is not waiting for it (computing, or hung outside MPI, so
 * the collective does not progress), waits in it, or has finished it. A rank on another
 * node has no beacon here: it cannot be seen. Notes follow for the ranks that hold it up.
 * Without shared memory every rank keeps a private beacon and only its own op is named.
 * The first rank to report marks its beacon, so the ranks after it say only that it has.
 *
 * A pipeline (rt_watchdog_pipeline): only the ranks of a stage run the same program, so
 * sequence numbers are compared among them alone, and ops are named as their stage's
 * ("op 7 of stage 1 (recv of h from stage 0)", from the whole plan). When the op that
 * holds this rank up is a send or receive, a collective over the stages, or an agreement
 * of the world, the ranks of other stages it waits for are said too: waiting in which op,
 * running elsewhere, or stopped. Messages name the rank with its stage.
 *
 * On CUDA ranks (rt_watchdog_device) the host waits in no collective: NCCL's run on the
 * device's streams while the host waits for the device. There the backend names the
 * step's first collective, send or receive in flight and the ranks it waits for, from
 * its events and NCCL's asynchronous error, and aborts NCCL's communicators.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "report.h"
#include "runtime.h"

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "beacons are read by other processes: their atomics must be lock-free");

struct RtBeacon {
    atomic_llong started;  // collectives started: the sequence number of the last one
    atomic_llong waiting;  // the sequence number of the one it is blocked in; 0: none
    atomic_llong beat_ns;  // CLOCK_MONOTONIC (one clock per machine) at the watchdog's last tick; 0: none yet
    atomic_int op;         // the plan op of the last one started; PLAN_NONE: a call outside the plan
    atomic_int wait_op;    // the plan op of the one it is blocked in
    atomic_int ending;     // its watchdog has fired: it is saying why, and ending every rank
    char pad[64 - 3 * sizeof(atomic_llong) - 3 * sizeof(atomic_int)];  // one cache line per rank
};

enum { MAX_NOTES = 4 };
#define STALE_NS 2000000000LL  // no heartbeat for this long: the rank does not run (ticks are 100 ms)

static struct {
    double seconds;
    atomic_llong deadline_ns;         // 0: disarmed
    atomic_llong step;
    _Atomic(const char *) what;       // what is armed: "step", "loading the weights"
    _Atomic(const Plan *) wait_plan;  // the plan of the collectives this rank waited in
    _Atomic(const char *) wait_what;  // or the blocking call it waits in
    long long seq;                    // collectives started (the main thread's)
    RtBeacon *me;                     // this rank's beacon: shared, or `own`
    RtBeacon own;
    pthread_mutex_t lock;             // the thread's use of the beacons against detaching them
    int rank, world;
    RtBeacon **all;                   // world entries; NULL: another node; NULL: none attached
    unsigned char *cat;               // world entries: each rank's Cat, when reporting
    const Plan *whole;                // a pipeline's plan of every stage (rt_watchdog_pipeline), or NULL
    int (*_Atomic hung)(void *ctx, char *msg, size_t n);  // the device's hung collective (rt_watchdog_device)
    void *_Atomic hung_ctx;
    int dp;                           // its data-parallel ranks per stage: rank r is stage r / dp
} wd = {.me = &wd.own, .lock = PTHREAD_MUTEX_INITIALIZER, .dp = 1};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- the beacons ---------------------------------------------------------------------- */

size_t rt_beacon_bytes(void) { return sizeof(RtBeacon); }

void rt_beacon_clear(RtBeacon *b) { memset(b, 0, sizeof *b); }

/* What a beacon says, from one to another (the private one to a shared one and back). */
static void copy_beacon(RtBeacon *to, RtBeacon *from)
{
    atomic_store(&to->started, atomic_load(&from->started));
    atomic_store(&to->waiting, atomic_load(&from->waiting));
    atomic_store(&to->beat_ns, atomic_load(&from->beat_ns));
    atomic_store(&to->op, atomic_load(&from->op));
    atomic_store(&to->wait_op, atomic_load(&from->wait_op));
    atomic_store(&to->ending, atomic_load(&from->ending));
}

static void detach_locked(void)
{
    if (wd.me != &wd.own) copy_beacon(&wd.own, wd.me);
    wd.me = &wd.own;
    plan_dealloc(wd.all);
    plan_dealloc(wd.cat);
    wd.all = NULL, wd.cat = NULL;
    atomic_store(&wd.wait_plan, NULL);
}

int rt_watchdog_attach(int rank, int world, RtBeacon *const *all, char *err, size_t errlen)
{
    RtBeacon **copy = plan_alloc(sizeof *copy * (size_t)world);
    unsigned char *cat = plan_alloc((size_t)world);
    if (!copy || !cat) {
        plan_dealloc(copy);
        plan_dealloc(cat);
        return plan_fail(err, errlen, "out of memory");
    }
    memcpy(copy, all, sizeof *copy * (size_t)world);
    pthread_mutex_lock(&wd.lock);
    detach_locked();
    wd.rank = rank, wd.world = world, wd.all = copy, wd.cat = cat;
    if (all[rank]) {
        copy_beacon(all[rank], &wd.own);
        wd.me = all[rank];
    }
    pthread_mutex_unlock(&wd.lock);
    return 0;
}

void rt_watchdog_pipeline(const Plan *whole, int dp)
{
    pthread_mutex_lock(&wd.lock);
    wd.whole = whole && whole->n_programs > 1 ? whole : NULL, wd.dp = dp > 0 ? dp : 1;
    pthread_mutex_unlock(&wd.lock);
}

void rt_watchdog_detach(void)
{
    pthread_mutex_lock(&wd.lock);
    detach_locked();
    pthread_mutex_unlock(&wd.lock);
}

int64_t rt_watchdog_enter(int32_t op)
{
    RtBeacon *b = wd.me;
    long long seq = ++wd.seq;
    atomic_store_explicit(&b->op, op, memory_order_relaxed);
    atomic_store_explicit(&b->started, seq, memory_order_release);
    return seq;
}

void rt_watchdog_wait(int64_t seq, const Plan *p, int32_t op, const char *what)
{
    RtBeacon *b = wd.me;
    if (p) atomic_store_explicit(&wd.wait_plan, p, memory_order_relaxed);  // kept, to name others' ops
    atomic_store_explicit(&wd.wait_what, what, memory_order_relaxed);
    atomic_store_explicit(&b->wait_op, op, memory_order_relaxed);
    atomic_store_explicit(&b->waiting, seq, memory_order_release);
}

void rt_watchdog_waited(void) { atomic_store_explicit(&wd.me->waiting, 0, memory_order_relaxed); }

/* ---- the message ---------------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, at;
} Buf;

__attribute__((format(printf, 2, 3))) static void put(Buf *b, const char *fmt, ...)
{
    if (b->at >= b->n) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->at, b->n - b->at, fmt, ap);
    va_end(ap);
    b->at = k < 0 ? b->n : b->at + (size_t)k;
}

static void put_loc(Buf *b, const Plan *p, const PlanOp *o)
{
    char file[64];
    const char *src = plan_meta_str(p, "source", "");
    if (*src) put(b, "%s:%d:%d", report_clean(src, file, sizeof file), o->line, o->col);
    else put(b, "line %d:%d", o->line, o->col);
}

static int32_t root(const Plan *p, int32_t t)
{
    int32_t a = p->tensors[t].alias;
    return a >= 0 && a < p->n_tensors ? a : t;
}

/* Whether op k writes (outputs) or reads (inputs) bytes of root tensor r. */
static int touches(const Plan *p, int32_t k, int32_t r, int outputs)
{
    const PlanOp *o = &p->ops[k];
    int32_t first = outputs ? o->out : o->in, n = outputs ? o->n_out : o->n_in;
    for (int32_t i = 0; i < n; i++)
        if (root(p, p->ids[first + i]) == r) return 1;
    return 0;
}

static int stage_of(int r) { return wd.whole ? r / wd.dp : 0; }

/* The ops [*lo, *hi) of the plan that rank r's beacon numbers its ops in: its stage's
 * program in the whole plan of a pipeline; p's own ops otherwise (*p set to the plan). */
static void program_of(const Plan **p, int r, int32_t *lo, int32_t *hi)
{
    if (wd.whole) {
        const PlanProgram *g = &wd.whole->programs[stage_of(r)];
        *p = wd.whole, *lo = g->first_op, *hi = g->first_op + g->n_ops;
    } else {
        *lo = 0, *hi = *p ? (*p)->n_ops : 0;
    }
}

/* A collective that a pass added has no source location of its own; it borrows one from
 * the data it moves: the op that last wrote its input, if located (*made = 1), else the
 * first located op that reads its output; among ops [lo, hi), its program's. PLAN_NONE if
 * neither. Only read when a timeout is reported. */
static int32_t borrowed(const Plan *p, int32_t op, int32_t lo, int32_t hi, int *made)
{
    const PlanOp *o = &p->ops[op];
    if (o->n_in > 0) {
        int32_t r = root(p, p->ids[o->in]);
        for (int32_t k = op - 1; k >= lo; k--)
            if (touches(p, k, r, 1)) {
                if (p->ops[k].line > 0) return *made = 1, k;
                break;
            }
    }
    if (o->n_out > 0) {
        int32_t r = root(p, p->ids[o->out]);
        for (int32_t k = op + 1; k < hi; k++)
            if (p->ops[k].line > 0 && touches(p, k, r, 0)) return *made = 0, k;
    }
    return PLAN_NONE;
}

/* "op 42 (all_gather of h.1.flat_param used at gpt2.fsm:24:23, block h.1)": op `op` as
 * rank r's beacon numbers it; in a pipeline "op 7 of stage 1 (...)", its stage's op. */
static void put_op(Buf *b, const Plan *p, int r, int32_t op)
{
    int32_t lo, hi;
    program_of(&p, r, &lo, &hi);
    if (!p || op < 0 || op >= hi - lo) {
        put(b, op == PLAN_NONE || op == RT_WAIT_STAGE ? "a blocking collective outside the step" : "a collective of the plan");
        return;
    }
    int32_t at = lo + op;
    const PlanOp *o = &p->ops[at];
    char name[64], of[64], block[64];
    put(b, "op %d", op);
    if (wd.whole) put(b, " of stage %d", stage_of(r));
    put(b, " (%s", report_clean(plan_str(p, o->op), name, sizeof name));
    const char *x = o->n_in > 0    ? plan_str(p, p->tensors[p->ids[o->in]].name)
                    : o->n_out > 0 ? plan_str(p, p->tensors[p->ids[o->out]].name)  // a recv: what it brings
                                   : "";
    if (*x) put(b, " of %s", report_clean(x, of, sizeof of));
    for (int32_t a = 0; a < o->n_attr; a++)  // a send or recv: its peer
        if (p->attrs[o->attr + a].kind == PLAN_ATTR_INT && !strcmp(plan_str(p, p->attrs[o->attr + a].key), "peer"))
            put(b, " %s stage %" PRId64, o->n_in ? "to" : "from", p->attrs[o->attr + a].i);
    int made = 0;
    int32_t from = o->line > 0 ? at : borrowed(p, at, lo, hi, &made);
    if (from == at) put(b, ", ");
    else if (from != PLAN_NONE) put(b, made ? " made at " : " used at ");
    if (from != PLAN_NONE) put_loc(b, p, &p->ops[from]);
    if (o->block >= 0 && o->block < p->n_blocks)
        put(b, ", block %s", report_clean(plan_str(p, p->blocks[o->block].name), block, sizeof block));
    put(b, ")");
}

/* Where a rank is, as seen from a rank whose wait hangs, about the collective that
 * holds it up: the earliest one that a running rank waits in (every later one waits
 * behind it, as each rank runs them in the same order). The first three hold it up. */
/* In a pipeline only the ranks of this rank's stage run its program, so only they count
 * its collectives alike; the others are ELSEWHERE, or PARTNER when the op holding this
 * rank up waits for them (a send's or receive's peer, the pipeline group of a
 * collective over the stages). */
typedef enum {
    CAT_NOT_REACHED, CAT_STOPPED, CAT_NOT_WAITING, CAT_UNSEEN, CAT_IN_IT, CAT_FINISHED, CAT_PARTNER, CAT_ELSEWHERE,
    CAT_COUNT
} Cat;

static const char *const CAT_ONE[CAT_PARTNER] = {
    "did not reach it", "started it, then stopped running", "started it but is not waiting for it",
    "cannot be seen from here (another node)", "is waiting in it", "has finished it"};
static const char *const CAT_MANY[CAT_PARTNER] = {
    "did not reach it", "started it, then stopped running", "started it but are not waiting for it",
    "cannot be seen from here (another node)", "are waiting in it", "have finished it"};

static int stale(const RtBeacon *b, long long now)
{
    long long beat = atomic_load(&b->beat_ns);
    return beat && now - beat > STALE_NS;
}

static Cat classify(int r, long long seq, long long now)
{
    const RtBeacon *b = wd.all[r];
    if (!b) return CAT_UNSEEN;
    long long waiting = atomic_load(&b->waiting);
    if (atomic_load(&b->started) < seq) return CAT_NOT_REACHED;
    if (r != wd.rank && stale(b, now)) return CAT_STOPPED;
    return waiting == seq ? CAT_IN_IT : waiting > seq ? CAT_FINISHED : CAT_NOT_WAITING;
}

/* The collective that holds up this rank's (seq): the earliest a running rank waits in;
 * its plan op in *op. */
static long long holding(long long seq, long long now, int32_t *op)
{
    for (int r = 0; r < wd.world; r++) {
        const RtBeacon *b = wd.all[r];
        if (!b || (r != wd.rank && stale(b, now)) || stage_of(r) != stage_of(wd.rank)) continue;
        long long w = atomic_load(&b->waiting);
        if (w && w < seq) seq = w, *op = atomic_load(&b->wait_op);
    }
    return seq;
}

static int count_cat(Cat c)
{
    int n = 0;
    for (int r = 0; r < wd.world; r++) n += wd.cat[r] == c;
    return n;
}

/* "rank 2 did not reach it", "ranks 0-5, 9 are waiting in it": the ranks of category c. */
static void put_ranks(Buf *b, Cat c)
{
    int n = count_cat(c);
    put(b, n == 1 ? "rank " : "ranks ");
    const char *sep = "";
    for (int r = 0; r < wd.world; r++) {
        if (wd.cat[r] != c) continue;
        int end = r;
        while (end + 1 < wd.world && wd.cat[end + 1] == c) end++;
        if (end - r >= 2) put(b, "%s%d-%d", sep, r, end);
        else if (end > r) put(b, "%s%d, %d", sep, r, end);
        else put(b, "%s%d", sep, r);
        sep = ", ";
        r = end;
    }
    put(b, " %s", n == 1 ? CAT_ONE[c] : CAT_MANY[c]);
}

/* Categories [from, to) that have ranks, joined by "; "; how many did. */
static int put_cats(Buf *b, Cat from, Cat to)
{
    int shown = 0;
    for (Cat c = from; c < to; c++) {
        if (!count_cat(c)) continue;
        put(b, shown++ ? "; " : "");
        put_ranks(b, c);
    }
    return shown;
}

/* How far collective `of` is from `seq`: ", 2 collectives before it". */
static void put_distance(Buf *b, long long of, long long seq)
{
    long long d = seq > of ? seq - of : of - seq;
    if (d) put(b, ", %lld collective%s %s it", d, d == 1 ? "" : "s", seq > of ? "before" : "after");
}

/* For each rank that holds the collective up: what it last started, and whether it runs
 * (a rank of another stage counts its ops apart: no distance). */
static void put_notes(Buf *b, const Plan *p, long long seq, long long now)
{
    int shown = 0;
    for (int r = 0; r < wd.world && shown < MAX_NOTES; r++) {
        if ((wd.cat[r] >= CAT_UNSEEN && wd.cat[r] != CAT_PARTNER) || !wd.all[r]) continue;
        const RtBeacon *x = wd.all[r];
        long long started = atomic_load(&x->started), waiting = atomic_load(&x->waiting);
        long long beat = atomic_load(&x->beat_ns);
        int here = stage_of(r) == stage_of(wd.rank);
        put(b, "[%s] note: rank %d ", rt_comm_who(), r);
        if (!here) put(b, "(stage %d) ", stage_of(r));
        if (started) {
            put(b, "last started ");
            put_op(b, p, r, atomic_load(&x->op));
            if (here) put_distance(b, started, seq);
        } else {
            put(b, "has started no collective");
        }
        if (waiting) {
            put(b, "; it waits in ");
            put_op(b, p, r, atomic_load(&x->wait_op));
            if (here) put_distance(b, waiting, seq);
        }
        if (beat && now - beat > STALE_NS)
            put(b, "; it has not run for %.1f s (stopped, or dead)", (double)(now - beat) * 1e-9);
        else if (beat)
            put(b, "; it is running");
        put(b, "\n");
        shown++;
    }
}

/* "op 42 (...) did not complete: rank 2 did not reach it (ranks 0, 1 are waiting in it)",
 * or, when another rank waits in an earlier one, "...: it waits behind op 40 (...): ...".
 * Then one note per rank that holds it up. */
/* The ranks of other stages that op `op` of rank r's stage waits for: a send's or
 * receive's peer at r's data-parallel index, the ranks at that index for a collective over
 * the stages, everyone for a blocking call over the world (agreeing on a result); none
 * for one over the stage's ranks (RT_WAIT_STAGE). */
static void mark_partners(int r, int32_t op)
{
    int32_t lo, hi;
    const Plan *p = NULL;
    program_of(&p, r, &lo, &hi);
    int peer = -1, pipe = op == PLAN_NONE;  // peer: a stage; pipe: every stage
    if (op >= 0 && op < hi - lo) {
        const PlanOp *o = &p->ops[lo + op];
        for (int32_t a = 0; a < o->n_attr; a++) {
            const PlanAttr *at = &p->attrs[o->attr + a];
            const char *key = plan_str(p, at->key);
            if (at->kind == PLAN_ATTR_INT && !strcmp(key, "peer")) peer = (int)at->i;
            if (at->kind == PLAN_ATTR_INT && !strcmp(key, "group")) pipe = at->i == 1;
        }
    }
    for (int q = 0; q < wd.world; q++)
        if (stage_of(q) != stage_of(r) && (op == PLAN_NONE || q % wd.dp == r % wd.dp) &&
            (pipe || stage_of(q) == peer))
            wd.cat[q] = CAT_PARTNER;
}

/* Where a partner rank is: "rank 3 has not run for 2.1 s (stopped, or dead)". */
static void put_partners(Buf *b, const Plan *p, long long now)
{
    int shown = 0;
    for (int r = 0; r < wd.world && shown < MAX_NOTES; r++) {
        if (wd.cat[r] != CAT_PARTNER) continue;
        const RtBeacon *x = wd.all[r];
        put(b, "%srank %d ", shown++ ? "; " : "", r);
        long long waiting = x ? atomic_load(&x->waiting) : 0;
        if (!x) put(b, "cannot be seen from here (another node)");
        else if (stale(x, now)) put(b, "has not run for %.1f s (stopped, or dead)", (double)(now - atomic_load(&x->beat_ns)) * 1e-9);
        else if (waiting) put(b, "waits in "), put_op(b, p, r, atomic_load(&x->wait_op));
        else put(b, "runs but waits in nothing (it is computing, or hung outside MPI)");
    }
}

static void put_diagnosis(Buf *b, long long seq, const Plan *p, int32_t op, const char *what)
{
    if (what) put(b, "%s", what);
    else put_op(b, p, wd.rank, op);
    put(b, " did not complete: ");
    long long now = now_ns();
    int32_t first_op = op;
    long long first = holding(seq, now, &first_op);
    if (first < seq) {
        put(b, "it waits behind ");
        put_op(b, p, wd.rank, first_op);
        put(b, ": ");
    }
    for (int r = 0; r < wd.world; r++)
        wd.cat[r] = (unsigned char)(stage_of(r) == stage_of(wd.rank) ? classify(r, first, now) : CAT_ELSEWHERE);
    for (int r = 0; r < wd.world && wd.whole; r++)
        if (wd.cat[r] == CAT_IN_IT) mark_partners(r, first_op);
    int shown = put_cats(b, CAT_NOT_REACHED, CAT_IN_IT), partners = count_cat(CAT_PARTNER);
    if (!count_cat(CAT_NOT_REACHED) && !count_cat(CAT_STOPPED) && !count_cat(CAT_NOT_WAITING) && !partners)
        put(b, "%severy rank that can be seen is in it or past it%s", shown ? "; " : "",
            count_cat(CAT_UNSEEN) ? "" : " (MPI itself is stuck?)");
    if (partners) {
        put(b, "%sit waits on %s: ", shown ? "; " : "", partners == 1 ? "another stage" : "other stages");
        put_partners(b, p, now);
    }
    put(b, " (");
    put_cats(b, CAT_IN_IT, CAT_PARTNER);
    put(b, "); ending every rank\n");
    put_notes(b, p, first, now);
}

void rt_watchdog_device(int (*hung)(void *ctx, char *msg, size_t n), void *ctx)
{
    atomic_store(&wd.hung_ctx, ctx);
    atomic_store(&wd.hung, hung);
}

static void report(long long last_tick)
{
    static char text[8192], device[1024];
    Buf b = {text, sizeof text, 0};
    char what[96];
    long long step = atomic_load(&wd.step), now = now_ns();
    snprintf(what, sizeof what, step >= 0 ? "%s %lld" : "%s", atomic_load(&wd.what), step);
    put(&b, "[%s] fsexec: timeout: %s did not finish within %g s (--timeout): ", rt_comm_who(), what, wd.seconds);
    long long seq = atomic_load_explicit(&wd.me->waiting, memory_order_acquire);
    const Plan *p = atomic_load(&wd.wait_plan);
    const char *call = atomic_load(&wd.wait_what);
    int told = -1;  // a rank whose watchdog has fired already and said why
    for (int r = 0; r < wd.world && wd.all && told < 0; r++)
        if (r != wd.rank && wd.all[r] && atomic_load(&wd.all[r]->ending)) told = r;
    atomic_store(&wd.me->ending, 1);
    if (now - last_tick > STALE_NS) {
        put(&b, "this rank itself did not run for %.1f s (stopped, or starved of CPU); ending every rank\n",
            (double)(now - last_tick) * 1e-9);
    } else if (told >= 0) {
        put(&b, "rank %d has said why; ending every rank\n", told);
    } else if (!seq && atomic_load(&wd.hung) && atomic_load(&wd.hung)(atomic_load(&wd.hung_ctx), device, sizeof device)) {
        put(&b, "on the device, %s did not complete (NCCL's communicators aborted); ending every rank\n", device);
    } else if (!seq) {
        put(&b, "this rank is not waiting for another (it is still computing, or hung outside MPI); ending every "
            "rank\n");
    } else if (!wd.all) {
        if (call) put(&b, "%s", call);
        else put_op(&b, p, wd.rank, atomic_load(&wd.me->wait_op));
        put(&b, " did not complete; where the other ranks are is unknown (no shared memory); ending every rank\n");
    } else {
        put_diagnosis(&b, seq, p, atomic_load(&wd.me->wait_op), call);
    }
    if (b.at >= b.n) memcpy(text + sizeof text - 5, "...\n", 5);
    fputs(text, stderr);
    fflush(stderr);
}

/* ---- the thread ----------------------------------------------------------------------- */

static void *watch(void *arg)
{
    (void)arg;
    struct timespec tick = {0, 100 * 1000 * 1000};
    for (;;) {
        nanosleep(&tick, NULL);
        pthread_mutex_lock(&wd.lock);
        long long now = now_ns(), last = atomic_load(&wd.me->beat_ns);
        atomic_store_explicit(&wd.me->beat_ns, now, memory_order_relaxed);
        long long d = atomic_load(&wd.deadline_ns);
        if (!d || now < d) {
            pthread_mutex_unlock(&wd.lock);
            continue;
        }
        report(last ? last : now);
        alarm(10);  // should MPI_Abort itself hang, SIGALRM ends this process
        rt_comm_abort(1);
    }
    return NULL;
}

int rt_watchdog_start(double seconds, char *err, size_t errlen)
{
    if (seconds <= 0) return 0;
    wd.seconds = seconds;
    atomic_store(&wd.what, "step");
    pthread_t th;
    int rc = pthread_create(&th, NULL, watch, NULL);
    if (rc) return plan_fail(err, errlen, "cannot start the watchdog thread: %s", strerror(rc));
    pthread_detach(th);
    return 0;
}

void rt_watchdog_arm(const char *what, int64_t step)
{
    if (wd.seconds <= 0) return;
    atomic_store(&wd.what, what);
    atomic_store(&wd.step, (long long)step);
    atomic_store(&wd.deadline_ns, now_ns() + (long long)(wd.seconds * 1e9));
}

void rt_watchdog_disarm(void) { atomic_store(&wd.deadline_ns, 0); }
