/* report/memlimit.c: the message of a plan over --mem-limit. It says by how much the
 * arena passes the limit, what is live at the peak (the largest buffers), and for each
 * setting the caller compiled (MemWhatIf) the arena it gives and what it saves, best
 * first, marking the ones that fit; the ones that train differently (a smaller batch)
 * come after every one that trains the same (gradient accumulation, sharding, ...). The
 * caller decides which settings exist; this file only lays out what it was given. For a
 * plan of several stages it is given the stage with the largest arena, and says so.
 */
#include <stdlib.h>
#include <string.h>

#include "report.h"

int report_over_limit(const MemReport *r, int64_t limit) { return r->arena_bytes > limit; }

static int by_arena(const void *a, const void *b)
{
    const MemWhatIf *x = a, *y = b;
    if ((x->arena < 0) != (y->arena < 0)) return x->arena < 0 ? 1 : -1;
    if (x->changes_training != y->changes_training) return x->changes_training ? 1 : -1;
    return x->arena < y->arena ? -1 : x->arena > y->arena;
}

static void print_live(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    char where[256], name[64], type[128], bytes[32], made[160];
    fprintf(out, "  the peak is at op %d: %s; the largest of the %d buffers live there:\n", r->peak_at[PLAN_PLACE_DEVICE],
            report_op_where(p, p->n_ops ? r->peak_at[PLAN_PLACE_DEVICE] : PLAN_NONE, where, sizeof where),
            r->n_live_at_peak);
    for (int i = 0; i < r->n_top && i < 5; i++) {
        int32_t t = r->top[i].tensor;
        fprintf(out, "    %-24s %-24s %11s  %-20s %s\n", report_tensor_name(p, t, name, sizeof name),
                report_type(&p->tensors[t], type, sizeof type), report_bytes(r->top[i].bytes, bytes, sizeof bytes),
                report_category_name(r->top[i].cat), report_made_by(p, t, made, sizeof made));
    }
}

static void print_what_ifs(const MemReport *r, int64_t limit, const MemWhatIf *given, int n, FILE *out)
{
    MemWhatIf w[16];
    int k = 0;
    for (int i = 0; i < n && k < 16; i++)
        if (given[i].arena >= 0 && given[i].arena < r->arena_bytes) w[k++] = given[i];
    if (!k) {
        fprintf(out, "  no setting this fsc implements makes the plan smaller; a smaller model (-D) would\n");
        return;
    }
    qsort(w, (size_t)k, sizeof *w, by_arena);
    fprintf(out, "  settings that would cut it (each alone, compiled to check):\n");
    char a[32], s[32];
    for (int i = 0; i < k; i++)
        fprintf(out, "    %-34s arena %10s, saves %10s%s  %s%s\n", w[i].flags, report_bytes(w[i].arena, a, sizeof a),
                report_bytes(r->arena_bytes - w[i].arena, s, sizeof s), w[i].arena <= limit ? " (fits)" : "       ",
                w[i].what, w[i].changes_training ? " (changes the training)" : "");
}

void report_limit_print(const MemReport *r, int64_t limit, const MemWhatIf *w, int n, FILE *out)
{
    char a[32], l[32], over[32], label[96], stages[48] = "";
    if (r->n_stages > 1) snprintf(stages, sizeof stages, ", the largest of the %d stages", r->n_stages);
    fprintf(out, "the plan needs an arena of %s per rank (%s%s), %s over the limit of %s\n",
            report_bytes(r->arena_bytes, a, sizeof a), report_label(r, label, sizeof label), stages,
            report_bytes(r->arena_bytes - limit, over, sizeof over), report_bytes(limit, l, sizeof l));
    print_live(r, out);
    print_what_ifs(r, limit, w, n, out);
}
