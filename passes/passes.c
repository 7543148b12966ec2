/* passes/passes.c: the pass list as data, and the driver that runs it. Unlike DESIGN.md's order,
 * precision runs before autodiff (the backward is then born in the compute dtype, and a
 * cast's gradient casts back to the fp32 master); stages (the cut into pipeline stages)
 * runs before autodiff too, so each stage differentiates its own graph (its backward is
 * made where it runs, a tied param gets each stage's gradient of it, and checkpointing
 * recomputes a whole stage); and shard before optimizer: it decides what the optimizer
 * updates (a unit's flat buffer, or this rank's shard). After stages, every pass runs on
 * each stage graph, over the stage's data-parallel ranks.
 *
 * A forward-only program (evaluation, sampling) runs the passes whose `forward` column
 * is set, and the stages pass when it has stages: no autodiff, recompute, micro-batches,
 * optimizer or offload, so its graph is the forward and the loss alone, cut into the
 * training's stages, sharded (fsdp's gathers, the loss averaged over the ranks) and
 * planned like the training step's. */
#include <string.h>

#include "passes.h"

static const PassInfo PASSES[] = {
    {"fold", "a forward graph from lower",
     "matmuls read a transposed operand in place (their ta / tb flag) rather than the transpose's copy", pass_fold, 1},
    {"dce", "a forward graph from lower", "every node contributes to an output; unused params warned",
     pass_dce, 1},
    {"pad_vocab", "a forward graph after fold and dce; pad_vocab > 1",
     "a classifier's vocabulary param (read transposed by the head, and as an embedding's table) widened to a "
     "multiple of pad_vocab rows (Value.logical_rows: its own), or a [C, V] head read through pad(param) [C, Vp], "
     "every output retyped, the loss's valid = V",
     pass_pad_vocab, 1},
    {"precision", "the forward graph", "fp16/bf16: compute copies of fp32 params and inputs by casts; fp16 loss-scale state",
     pass_precision, 1},
    {"packed_attn", "the forward graph; pack_attention on",
     "split(x, 3) -> heads -> attention -> merge_heads as one attention_qkv(x), and Llama's heads -> rope -> "
     "attention -> merge_heads as rope_rows and attention_rows on the projections' rows (no layout copies, nothing "
     "of them saved)", pass_packed_attn, 0},
    {"stages", "the forward graph of one micro-batch; stages P > 1",
     "one forward graph per stage (Graph.stage_graphs), which every later pass rewrites on its own: blocks cut by "
     "balance, free nodes copied where read, send and recv between stages (Graph.links), tied params listed",
     pass_stages, 0},
    {"autodiff", "outputs[0] is a float scalar loss (a stage graph: or links to seed from)",
     "backward nodes (zb1: the params' gradients apart, phase backward_weight); Value.grad of every used param; a "
     "stage's gradients of what it received sent back",
     pass_autodiff, 0},
    {"recompute", "backward nodes; the recompute setting names layers",
     "checkpointed blocks rerun their forward (phase recompute) just before their backward, which reads the copies",
     pass_recompute, 0},
    {"pipeline", "one micro-batch's forward and backward (lower split the batch by data-parallel ranks x microbatches)",
     "the micro-batches in the schedule's order (one stage: in turn; stages: gpipe, 1f1b, interleaved or zb1, "
     "checkpointed ones recomputing), batched inputs sliced, param gradients summed in place (Value.grad: the sum), "
     "tied params' sums exchanged, the loss their mean (with stages: on every stage)",
     pass_pipeline, 0},
    {"xent_count", "the micro-batches unrolled (pipeline); each ignore_index loss's backward as ir/grad.c makes it",
     "with D data-parallel ranks x M micro-batches > 1: each ignore_index loss scaled by its part's share of the "
     "targets the global batch counts (their target_count, summed, all-reduced before any backward), its "
     "backward's dloss likewise, so the step's loss and gradients are the global batch's mean", pass_xent_count, 1},
    {"xent", "the backward and the micro-batches in their final order; fuse_loss on",
     "each cross_entropy and the cross_entropy_bwd of its logits as one cross_entropy_fused, which writes the logits' "
     "gradient over them (its seed's nodes moved before it)", pass_xent, 0},
    {"embed_into", "the backward and the micro-batches in their final order; embed_grad_into on",
     "add(g, embedding_bwd(idx, dy)), g dead after it, as embedding_bwd_into(g, idx, dy): the rows added into "
     "g's buffer (a tied embedding's gradient: no dense table, no add)", pass_embed_into, 0},
    {"epilogue", "the backward and the micro-batches in their final order; fuse_gemm on",
     "a matmul with its bias add (and GELU), a GELU's gradient with its input's GEMM, a bias gradient with the "
     "weight gradient's GEMM, as one op each (cuBLASLt epilogues); with fuse_residual, a residual add in its GEMM "
     "(beta 1) or in its norm's backward", pass_epilogue, 0},
    {"shard", "param gradients; each rank's part of the batch",
     "flat param and grad buffers per unit, collectives in place in the order; Value.grad on what the optimizer updates",
     pass_shard, 1},
    {"gradsum", "Value.grad on what the optimizer updates, the shard pass's reductions",
     "nothing: the proof that each gradient is summed over every data-parallel rank once and averaged once (an "
     "internal error otherwise)", pass_gradsum, 1},
    {"optimizer", "Value.grad on each param (or flat storage) to update", "step input, lr and grad_norm outputs, state tensors, update nodes",
     pass_optimizer, 0},
    {"offload", "update nodes on the fp32 storage they update; offload optimizer or params",
     "the fp32 masters, their state and the updates in the host space; the device's params in the compute dtype, "
     "copied from the host once a step (offload params: before each fsdp gather); gradients to the host after their "
     "reduction (to_host, to_device nodes)",
     pass_offload, 0},
    {"slice_view", "every node, in the order schedule keeps for compute; slice_views on",
     "each slice whose positions are one run of its input's bytes, and whose input's buffer nothing writes while "
     "the slice's value is read, as slice_view: its value lies in the input's bytes (Value.view_offset), no copy",
     pass_slice_view, 1},
    {"schedule", "every node; fsdp gathers at their first use",
     "the final node order (fsdp gathers prefetched a block ahead); Node.stream of every node; Node.wait: what each "
     "waits for on other streams", pass_schedule, 1},
    {"fuse", "the final node order", "Node.group: runs of consecutive elementwise nodes of one shape that feed each other",
     pass_fuse, 1},
    {"memplan", "the final node order, its waits and fused groups",
     "Value.offset (in its space's arena) and live range of every value; Graph.space_bytes", pass_memplan, 1},
};
enum { N_PASSES = sizeof PASSES / sizeof *PASSES };

const PassInfo *passes_list(int *n)
{
    *n = N_PASSES;
    return PASSES;
}

static void print_graph(const Graph *g, const Options *o)
{
    FILE *out = o->print_out ? o->print_out : stdout;
    if (o->print_json)
        ir_print_json(g, out);
    else
        ir_print(g, out);
}

/* Settings that do not go together: an error before any pass runs. */
static int check_supported(const TrainConfig *t, Diag *d)
{
    if (t->offload == OFFLOAD_PARAMS && t->shard != SHARD_FSDP)
        diag_error(d, (Loc){0}, "offload params keeps fsdp's param shards on the host (FSDP's CPUOffload), so it needs "
                   "--shard fsdp; with %s, --offload optimizer keeps the fp32 master and the optimizer state there",
                   shard_name(t->shard));
    if (t->delayed_update && t->offload == OFFLOAD_NONE)
        diag_error(d, (Loc){0}, "delayed_update overlaps offload's host update with the next step, so it needs "
                   "--offload optimizer (or params); without offload the update runs on the device, in its step");
    return d->n_errors ? -1 : 0;
}

/* The passes of the list (a forward-only program: those marked forward, and stages) on g,
 * and once the stages pass has split it, on each stage graph, over the data-parallel ranks
 * of a stage; 0, or -1 after an error. */
static int run_list(Graph *g, const Options *o, int forward_only, Diag *d)
{
    Options so = *o;
    if (o->train.stages > 1) so.train.world = o->train.world / o->train.stages;
    for (int i = 0; i < N_PASSES; i++) {
        if (forward_only && !PASSES[i].forward && PASSES[i].run != pass_stages) continue;
        int n = g->n_stage_graphs ? g->n_stage_graphs : 1;
        for (int s = 0; s < n; s++) {
            Graph *sg = g->n_stage_graphs ? g->stage_graphs[s] : g;
            if (PASSES[i].run(sg, g->n_stage_graphs ? &so : o, d) != 0 || d->n_errors) return -1;
            if (o->verify && ir_verify(sg, stderr) != 0) {
                diag_error(d, (Loc){0}, "internal error: the IR is invalid after pass '%s'%s%s", PASSES[i].name,
                           g->n_stage_graphs ? " (a stage graph)" : "", forward_only ? " (a forward-only program)" : "");
                return -1;
            }
        }
        if (o->print_after && !strcmp(o->print_after, PASSES[i].name)) print_graph(g, o);
    }
    return 0;
}

int passes_run_forward(Graph *g, const Options *o, Diag *d)
{
    FS_ASSERT(o->train.microbatches <= 1 && !o->print_after);
    passes_eval_identity(g);  // dropout is the identity in a forward-only program (model.eval())
    return run_list(g, o, 1, d);
}

int passes_run(Graph *g, const Options *o, Diag *d)
{
    if (check_supported(&o->train, d)) return -1;
    int found = !o->print_after || !strcmp(o->print_after, "lower");
    for (int i = 0; i < N_PASSES && !found; i++) found = !strcmp(o->print_after, PASSES[i].name);
    if (!found) {
        const char *names[N_PASSES + 1] = {"lower"};
        for (int i = 0; i < N_PASSES; i++) names[i + 1] = PASSES[i].name;
        const char *near = diag_closest(o->print_after, names, N_PASSES + 1);
        diag_error(d, (Loc){0}, "--print-after: no pass named '%s'%s%s%s", o->print_after,
                   near ? "; did you mean '" : "", near ? near : "", near ? "'?" : "");
        return -1;
    }
    if (o->print_after && !strcmp(o->print_after, "lower")) print_graph(g, o);
    return run_list(g, o, 0, d);
}
