/* report/stages.c: the memory report of every pipeline stage. Each stage's program is
 * extracted alone (plan_extract_program: its tensors, ops and outputs, ids from 0) and
 * reported by the one-program code, so a stage reads exactly as a plan of that program
 * would, and a plan of one program is reported as it always was. The stage with the
 * largest device arena is the one a rank's memory is checked against (--mem-limit).
 */
#include <string.h>

#include "report.h"

MemStages *report_stages_new(const Plan *p, char *err, size_t errlen)
{
    if (p->n_programs < 1) {
        snprintf(err, errlen, "the plan has no program (no memory plan)");
        return NULL;
    }
    MemStages *s = plan_alloc(sizeof *s);
    MemReport **stage = plan_alloc(sizeof *stage * (size_t)p->n_programs);
    if (!s || !stage) {
        plan_dealloc(s), plan_dealloc(stage);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    memset(stage, 0, sizeof *stage * (size_t)p->n_programs);
    *s = (MemStages){.plan = p, .n = p->n_programs, .stage = stage};
    for (int32_t k = 0; k < s->n; k++) {
        char why[256];
        stage[k] = report_mem_new_stage(p, k, why, sizeof why);
        if (!stage[k]) {
            if (s->n > 1)
                snprintf(err, errlen, "stage %d: %s", k, why);
            else
                snprintf(err, errlen, "%s", why);
            report_stages_free(s);
            return NULL;
        }
        if (stage[k]->arena_bytes > stage[s->largest]->arena_bytes) s->largest = k;
    }
    return s;
}

void report_stages_free(MemStages *s)
{
    if (!s) return;
    for (int32_t k = 0; k < s->n; k++) report_mem_free(s->stage[k]);
    plan_dealloc(s->stage);
    plan_dealloc(s);
}

const MemReport *report_stages_largest(const MemStages *s) { return s->stage[s->largest]; }
