/* passes/passes.h: the pass pipeline. Each pass is one file and one entry point that
 * rewrites the graph and leaves it valid (ir_verify runs after every pass when asked).
 * The order is the table in passes.c; `fsc --print-after NAME` prints the IR there. */
#ifndef FS_PASSES_H
#define FS_PASSES_H

#include "ir.h"

typedef struct Options {
    TrainConfig train;
    const char *print_after;  // a pass name, or NULL
    int print_json;           // print as JSON rather than text
    FILE *print_out;          // where --print-after goes (stdout)
    int verify;               // ir_verify after every pass
} Options;

typedef struct {
    const char *name;
    const char *needs;  // what the pass expects of the graph
    const char *gives;  // what holds after it
    int (*run)(Graph *g, const Options *o, Diag *d);
    int forward;        // runs for a forward-only program too (passes_run_forward)
} PassInfo;

/* The pipeline, in order. */
const PassInfo *passes_list(int *n);
/* Runs every pass; returns 0, or -1 after a pass reported an error. An unknown
 * o->print_after is reported before anything runs. */
int passes_run(Graph *g, const Options *o, Diag *d);
/* The passes of a forward-only program (no backward, no optimizer) on a graph lowered
 * with one micro-batch (and the training's stages: cut as the training's, by an explicit
 * balance); 0, or -1 after an error. */
int passes_run_forward(Graph *g, const Options *o, Diag *d);

/* ---- one file each, in pipeline order ------------------------------------------------ */
int pass_fold(Graph *g, const Options *o, Diag *d);       // passes/fold.c
int pass_dce(Graph *g, const Options *o, Diag *d);        // passes/dce.c
int pass_pad_vocab(Graph *g, const Options *o, Diag *d);  // passes/pad_vocab.c: a vocabulary the tensor cores like
int pass_precision(Graph *g, const Options *o, Diag *d);  // passes/precision.c
int pass_stages(Graph *g, const Options *o, Diag *d);     // passes/stages.c
int pass_autodiff(Graph *g, const Options *o, Diag *d);   // passes/autodiff.c
int pass_recompute(Graph *g, const Options *o, Diag *d);  // passes/recompute.c
int pass_pipeline(Graph *g, const Options *o, Diag *d);  // passes/pipeline.c
int pass_xent(Graph *g, const Options *o, Diag *d);       // passes/xent.c: the fused classifier
int pass_xent_count(Graph *g, const Options *o, Diag *d);  // passes/xent_count.c: ignore_index's global count
int pass_embed_into(Graph *g, const Options *o, Diag *d); // passes/embed_into.c: an embedding's gradient in place
int pass_packed_attn(Graph *g, const Options *o, Diag *d); // passes/packed_attn.c: attention on the packed QKV output
int pass_epilogue(Graph *g, const Options *o, Diag *d);   // passes/epilogue.c: GEMM epilogues
int pass_shard(Graph *g, const Options *o, Diag *d);      // passes/shard.c
int pass_gradsum(Graph *g, const Options *o, Diag *d);    // passes/gradsum.c: every gradient summed over all ranks once
int pass_optimizer(Graph *g, const Options *o, Diag *d);  // passes/optimizer.c
int pass_offload(Graph *g, const Options *o, Diag *d);    // passes/offload.c
int pass_slice_view(Graph *g, const Options *o, Diag *d); // passes/slice_view.c: slices as views
int pass_schedule(Graph *g, const Options *o, Diag *d);   // passes/schedule.c
int pass_fuse(Graph *g, const Options *o, Diag *d);       // passes/fuse.c
int pass_memplan(Graph *g, const Options *o, Diag *d);    // passes/memplan.c

/* ---- passes/eval.c: for evaluation programs (forward only), before passes_run ---------- */
/* Dropout is the identity in evaluation: every dropout's readers (and the graph's outputs)
 * read its input instead; pass_dce then removes the nodes. Returns how many it bypassed. */
int passes_eval_identity(Graph *g);

/* ---- passes/decode.c: the decode program of a language model, before passes_run_forward -- */
/* The one-token graph of g, the lowered sampling program (tokens [1, T], dropout the
 * identity) whose logits [1, T, V] are value `logits`: tokens [1, 1] and a position
 * (SR_POS), a KV cache per attention (ROLE_KV_CACHE), the logits [1, 1, V] its output.
 * 0 with *out (the caller's to free), or -1 with why the model cannot decode. */
int passes_decode(const Graph *g, int logits, Graph **out, char *why, size_t whylen);

#endif
