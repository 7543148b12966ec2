/* runtime/ckexport.c: a checkpoint's params as one file (--export): fsexec's own format
 * streamed through one buffer (bounded memory, whatever the model's size), or Hugging
 * Face's names and layouts (rt_hf_write), consolidated in memory. Every byte read is
 * checked against its piece's CRC-32 and every param's values against their domain
 * (rt_state_check: f32, finite) before the output is committed; the output is refused
 * before any work when it is one of the checkpoint's own files.
 */
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"

/* ---- the consolidated export ------------------------------------------------------- */

/* Hugging Face's names and layouts (rt_hf_write): every param consolidated in memory
 * from its pieces, since the layout transposes whole tensors; *bytes: what that holds. */
static int export_hf(const RtCheckpoint *c, const char *out, RtWeightsFormat f, int64_t *bytes, char *err,
                     size_t errlen)
{
    int32_t n = 0;
    int64_t total = 0, numel = 0;  // numel: of the param whose pieces are being read
    int rc = 0;
    StEntry *t = plan_alloc(sizeof *t * (size_t)(c->n_pieces + 1));
    if (!t) return plan_fail(err, errlen, "out of memory");
    for (int32_t i = 0; i < c->n_pieces && !rc; i++) {
        const CkPiece *x = &c->pieces[i];
        if (x->kind != RT_STATE_PARAM) continue;
        if (x->dtype != PLAN_DT_F32) {
            rc = plan_fail(err, errlen, "param '%s' is %s in the checkpoint; --weights-format %s exports f32 params",
                           x->name, plan_dtype_name(x->dtype), rt_weights_format_name(f));
            break;
        }
        if (x->first == 0) {
            numel = 1;
            for (int d = 0; d < x->rank; d++) numel *= x->shape[d];
            t[n] = (StEntry){x->name, x->dtype, x->rank, x->shape, plan_alloc((size_t)numel * 4)};
            if (!t[n++].data) rc = plan_fail(err, errlen, "out of memory for param '%s' (%" PRId64 " elements)", x->name, numel);
            total += numel * 4;
        }
        int fits = n > 0 && !strcmp(t[n - 1].name, x->name) && x->first + x->count <= numel &&
                   x->end - x->begin == (uint64_t)x->count * 4;
        if (!rc && fits)
            rc = rt_checkpoint_read(c, i, (uint8_t *)t[n - 1].data + x->first * 4, err, errlen);
        else if (!rc)
            rc = ck_fail_file(c, x->file, err, errlen, "a piece of a param does not fit it (damaged manifest?)");
    }
    if (!rc) rc = rt_hf_write(out, f, t, n, c->step, err, errlen);
    for (int32_t k = 0; k < n; k++) plan_dealloc(t[k].data);
    plan_dealloc(t);
    *bytes = total;
    return rc;
}

int rt_checkpoint_export(const RtCheckpoint *c, const char *out, RtWeightsFormat f, int64_t *peak_buffer, char *err,
                         size_t errlen)
{
    enum { BUF = 16 << 20 };  // the one buffer every byte passes through
    const char *own = rt_checkpoint_holds(c, out);
    if (own)
        return plan_fail(err, errlen, "%s is %s/%s, a file of the checkpoint being exported: give another output", out,
                         c->dir, own);
    if (f != RT_WEIGHTS_FSEXEC) {
        int64_t held = 0;
        int rc = export_hf(c, out, f, &held, err, errlen);
        if (peak_buffer) *peak_buffer = held;
        return rc;
    }
    int32_t n = 0;
    StEntry *t = plan_alloc(sizeof *t * (size_t)(c->n_pieces + 1));
    uint8_t *buf = plan_alloc(BUF), *head = NULL;
    size_t hlen = 0;
    char step[32], why[512];
    snprintf(step, sizeof step, "%" PRId64, c->step);
    const char *kv[] = {"step", step};
    if (!t || !buf) {
        plan_dealloc(t), plan_dealloc(buf);
        return plan_fail(err, errlen, "out of memory");
    }
    for (int32_t i = 0; i < c->n_pieces; i++) {  // one entry per param; its pieces follow in order
        const CkPiece *x = &c->pieces[i];
        if (x->kind == RT_STATE_PARAM && x->first == 0) t[n++] = (StEntry){x->name, x->dtype, x->rank, x->shape, NULL};
    }
    int rc = 0;
    PlanOutput *o = NULL;
    if (rt_st_header(t, n, kv, 1, &head, &hlen)) rc = plan_fail(err, errlen, "out of memory building the header");
    if (!rc && !(o = plan_output_open(out, why, sizeof why))) rc = plan_fail(err, errlen, "%s: %s", out, why);
    if (!rc) plan_output_write(o, head, hlen);
    for (int32_t i = 0; i < c->n_pieces && !rc; i++) {
        const CkPiece *x = &c->pieces[i];
        if (x->kind != RT_STATE_PARAM) continue;
        uint32_t crc = 0;
        for (uint64_t at = x->begin; at < x->end && !rc; at += BUF) {
            uint64_t len = x->end - at < BUF ? x->end - at : BUF;
            if (rt_st_pread(c->files[x->file], buf, len, at))
                rc = ck_fail_file(c, x->file, err, errlen, "cannot read it");
            crc = plan_crc32(crc, buf, (size_t)len);
            int64_t es = plan_dtype_size(x->dtype), from = x->first + (int64_t)(at - x->begin) / es;
            if (!rc && rt_state_check(x->name, x->kind, x->dtype, buf, from, (int64_t)len / es, c->step, why,
                                      sizeof why))
                rc = ck_fail_file(c, x->file, err, errlen, why);
            if (!rc && plan_output_write(o, buf, (size_t)len)) break;  // commit reports it
        }
        if (!rc && crc != x->crc) {
            snprintf(why, sizeof why, "tensor '%s' (bytes %" PRIu64 " to %" PRIu64 " of the file) has CRC-32 %08" PRIx32
                     ", saved as %08" PRIx32 ": the file is damaged", x->key, x->begin, x->end, crc, x->crc);
            rc = ck_fail_file(c, x->file, err, errlen, why);
        }
    }
    if (rc) plan_output_abort(o);
    else if (plan_output_commit(o, why, sizeof why)) rc = plan_fail(err, errlen, "%s: %s", out, why);
    if (peak_buffer) *peak_buffer = BUF;
    plan_dealloc(head);
    plan_dealloc(buf);
    plan_dealloc(t);
    return rc;
}
