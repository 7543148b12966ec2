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
 */
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
} wd = {.me = &wd.own, .lock = PTHREAD_MUTEX_INITIALIZER};

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

/* A collective that a pass added has no source location of its own; it borrows one from
 * the data it moves: the op that last wrote its input, if located (*made = 1), else the
 * first located op that reads its output. PLAN_NONE if neither. Only read when a
 * timeout is reported. */
static int32_t borrowed(const Plan *p, int32_t op, int *made)
{
    const PlanOp *o = &p->ops[op];
    if (o->n_in > 0) {
        int32_t r = root(p, p->ids[o->in]);
        for (int32_t k = op - 1; k >= 0; k--)
            if (touches(p, k, r, 1)) {
                if (p->ops[k].line > 0) return *made = 1, k;
                break;
            }
    }
    if (o->n_out > 0) {
        int32_t r = root(p, p->ids[o->out]);
        for (int32_t k = op + 1; k < p->n_ops; k++)
            if (p->ops[k].line > 0 && touches(p, k, r, 0)) return *made = 0, k;
    }
    return PLAN_NONE;
}

/* "op 42 (all_gather of h.1.flat_param used at gpt2.fsm:24:23, block h.1)" */
static void put_op(Buf *b, const Plan *p, int32_t op)
{
    if (!p || op < 0 || op >= p->n_ops) {
        put(b, op == PLAN_NONE ? "a blocking collective outside the step" : "a collective of the plan");
        return;
    }
    const PlanOp *o = &p->ops[op];
    char name[64], of[64], block[64];
    put(b, "op %d (%s", op, report_clean(plan_str(p, o->op), name, sizeof name));
    const char *x = o->n_in > 0 ? plan_str(p, p->tensors[p->ids[o->in]].name) : "";
    if (*x) put(b, " of %s", report_clean(x, of, sizeof of));
    int made = 0;
    int32_t from = o->line > 0 ? op : borrowed(p, op, &made);
    if (from == op) put(b, ", ");
    else if (from != PLAN_NONE) put(b, made ? " made at " : " used at ");
    if (from != PLAN_NONE) put_loc(b, p, &p->ops[from]);
    if (o->block >= 0 && o->block < p->n_blocks)
        put(b, ", block %s", report_clean(plan_str(p, p->blocks[o->block].name), block, sizeof block));
    put(b, ")");
}

/* Where a rank is, as seen from a rank whose wait hangs, about the collective that
 * holds it up: the earliest one that a running rank waits in (every later one waits
 * behind it, as each rank runs them in the same order). The first three hold it up. */
typedef enum {
    CAT_NOT_REACHED, CAT_STOPPED, CAT_NOT_WAITING, CAT_UNSEEN, CAT_IN_IT, CAT_FINISHED, CAT_COUNT
} Cat;

static const char *const CAT_ONE[CAT_COUNT] = {
    "did not reach it", "started it, then stopped running", "started it but is not waiting for it",
    "cannot be seen from here (another node)", "is waiting in it", "has finished it"};
static const char *const CAT_MANY[CAT_COUNT] = {
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
        if (!b || (r != wd.rank && stale(b, now))) continue;
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

/* For each rank that holds the collective up: what it last started, and whether it runs. */
static void put_notes(Buf *b, const Plan *p, long long seq, long long now)
{
    int shown = 0;
    for (int r = 0; r < wd.world && shown < MAX_NOTES; r++) {
        if (wd.cat[r] >= CAT_UNSEEN) continue;
        const RtBeacon *x = wd.all[r];
        long long started = atomic_load(&x->started), waiting = atomic_load(&x->waiting);
        long long beat = atomic_load(&x->beat_ns);
        put(b, "[rank %d] note: rank %d ", wd.rank, r);
        if (started) {
            put(b, "last started ");
            put_op(b, p, atomic_load(&x->op));
            put_distance(b, started, seq);
        } else {
            put(b, "has started no collective");
        }
        if (waiting) {
            put(b, "; it waits in ");
            put_op(b, p, atomic_load(&x->wait_op));
            put_distance(b, waiting, seq);
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
static void put_diagnosis(Buf *b, long long seq, const Plan *p, int32_t op, const char *what)
{
    if (what) put(b, "%s", what);
    else put_op(b, p, op);
    put(b, " did not complete: ");
    long long now = now_ns();
    int32_t first_op = op;
    long long first = holding(seq, now, &first_op);
    if (first < seq) {
        put(b, "it waits behind ");
        put_op(b, p, first_op);
        put(b, ": ");
    }
    for (int r = 0; r < wd.world; r++) wd.cat[r] = (unsigned char)classify(r, first, now);
    int shown = put_cats(b, CAT_NOT_REACHED, CAT_IN_IT);
    if (!count_cat(CAT_NOT_REACHED) && !count_cat(CAT_STOPPED) && !count_cat(CAT_NOT_WAITING))
        put(b, "%severy rank that can be seen is in it or past it%s", shown ? "; " : "",
            count_cat(CAT_UNSEEN) ? "" : " (MPI itself is stuck?)");
    put(b, " (");
    put_cats(b, CAT_IN_IT, CAT_COUNT);
    put(b, "); ending every rank\n");
    put_notes(b, p, first, now);
}

static void report(long long last_tick)
{
    static char text[8192];
    Buf b = {text, sizeof text, 0};
    char what[96];
    long long step = atomic_load(&wd.step), now = now_ns();
    snprintf(what, sizeof what, step >= 0 ? "%s %lld" : "%s", atomic_load(&wd.what), step);
    put(&b, "[rank %d] fsexec: timeout: %s did not finish within %g s (--timeout): ", rt_comm_rank(), what,
        wd.seconds);
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
    } else if (!seq) {
        put(&b, "this rank is not waiting for another (it is still computing, or hung outside MPI); ending every "
            "rank\n");
    } else if (!wd.all) {
        if (call) put(&b, "%s", call);
        else put_op(&b, p, atomic_load(&wd.me->wait_op));
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
