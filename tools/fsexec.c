/* tools/fsexec.c: the runtime's command line. Thin: parse flags, load the plan (every
 * check is plan_read's), set up the executor, the data and the reporting, run the steps
 * (or --predict's evaluation program: runtime/predict.c), save what was asked. Exit
 * status: 0 done, 1 an error (a bad plan, an unreadable file,
 * a loss that is not finite), 2 a usage error or something this build cannot do.
 *
 * The step loop is the runtime's (runtime/step.c), and the backend that runs it is
 * chosen behind one table (runtime/device.c): the CPU's, or with --device cuda (or auto,
 * on a machine with a GPU) the CUDA backend (runtime/backend.h, loaded with dlopen),
 * which runs the steps on a device copy of the CPU Exec's arena (the host mirror: init,
 * data, weights files).
 *
 * Ranks: a plan for a world of N runs as N processes started by mpirun, srun, or
 * `fsexec --nproc N` (which checks N against the plan's world, then runs mpirun on this
 * binary as its child, relaying a Ctrl-C to the ranks: runtime/launch.c). The world is
 * the plan's stages x data-parallel ranks (rt_plan_layout):
 * rank r runs stage r / dp's program (plan_extract_program) as data-parallel index
 * r % dp, and everything after (the executor, data, weights, the step loop) sees that
 * one-program plan; a plan of one stage runs as it is. One rank reports: rank 0, or in
 * a pipeline the first rank of the last stage (it holds the logits); it prints progress
 * and writes the log; the first rank of each stage writes its weights (the paths are
 * checked on every rank before anything runs, so a bad one fails at once, not after
 * training). Step lines go to stdout (on a terminal, a bar on stderr: runtime/progress.c);
 * everything else (the start line, notes, errors) to stderr. Errors carry `[rank r]` (`[rank r, stage s]`); a world-size mismatch is
 * reported by every rank before MPI starts; any other error on one rank ends every rank
 * (MPI_Abort), except those all ranks see alike (a non-finite global loss, a failed save
 * or load: agreed, then a clean exit 1).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir.h"  // config_keys and diag_closest: fsc's settings and its matcher
#include "report.h"  // report_bytes: sizes as fsc --mem writes them
#include "runtime.h"

static const char USAGE[] =
    "usage: fsexec [options] PLAN\n"
    "       fsexec --inspect PLAN\n"
    "\n"
    "Runs a training plan compiled by fsc, or shows what one holds.\n"
    "\n"
    "options:\n"
    "  --steps N            training steps (default 100); 0 only initializes (with\n"
    "                       --save-weights or --checkpoint-dir: the initial state)\n"
    "  --seed S             seed of parameter init and data (default: the plan's seed)\n"
    "  --threads N          threads of a CPU rank (default: all cores): OpenMP's, over which\n"
    "                       the GEMMs are split (OpenBLAS itself runs on one)\n"
    "  --device DEV         where the steps run: auto (default: a CUDA GPU when this\n"
    "                       machine has one and the plan has a CUDA program, else the\n"
    "                       CPU), cpu, or cuda (an error without a GPU)\n"
    "  --cuda-graph         CUDA: capture step 2 as a CUDA graph and replay it for every\n"
    "                       later step (one launch a step); offload's host work is in it\n"
    "                       as host-function nodes\n"
    "  --tf32               CUDA: f32 matrix products on TF32 tensor cores (10-bit\n"
    "                       mantissa inputs, f32 accumulation), as torch's allow_tf32;\n"
    "                       only for a plan compiled with the tf32 setting (fsc --tf32 1),\n"
    "                       whose attention kernels it also puts there and which needs\n"
    "                       no flag: fsexec follows the plan\n"
    "  --data FILE          token file: llm.c's format or raw uint16 (default: a built-in\n"
    "                       byte-level corpus for language models; Gaussian blobs for\n"
    "                       classifiers)\n"
    "  --data NAME=FILE.npy,NAME=FILE.npy,...\n"
    "                       each input (by its .fsm name, any number of them) from a NumPy\n"
    "                       .npy file: float32/float64 for f32 inputs, int32/int64 for i32,\n"
    "                       C order, samples first, the rest the input's per-sample shape;\n"
    "                       batches drawn in --data-order, wrapping. --data may be repeated\n"
    "                       (one list), or be a directory DIR holding NAME.npy for each\n"
    "                       input. i32 values must be inside what the plan indexes with them\n"
    "                       (an embedding's rows, a loss's classes, or its ignore_index),\n"
    "                       f32 ones finite: checked as the files load\n"
    "  --data-format FMT    how to read --data: auto (default: llm.c's format by its magic,\n"
    "                       else raw uint16 unless the file looks like something else),\n"
    "                       llmc, or raw (headerless uint16, whatever the file looks like)\n"
    "  --data-order ORDER   random (default) or sequential windows (.npy: samples)\n"
    "  --val-data FILE      evaluate on held-out data with the plan's evaluation program (the\n"
    "                       forward and the loss: no backward, no optimizer; with its\n"
    "                       own arena: fsc --mem shows it) before the first step, every\n"
    "                       --eval-every steps and after the last; val_loss (classifiers:\n"
    "                       val_acc) on that step's line and in --log. FILE is a token file,\n"
    "                       read as --data is, or NAME=FILE.npy,NAME=FILE.npy (any model that\n"
    "                       trains on .npy files); every evaluation reads its first --eval-batches\n"
    "                       batches, in order. A classifier takes `--val-data blobs`: blob\n"
    "                       batches no training step draws. Pipelines evaluate\n"
    "                       through their stages; not those with interleaved model chunks\n"
    "  --eval-every N       evaluate every N steps too (default: only before the first step\n"
    "                       and after the last)\n"
    "  --eval-batches K     batches of each evaluation (default 10)\n"
    "  --sample N           generate N tokens from a language model instead of training, with\n"
    "                       the plan's decode program (one token at a position, with a KV cache\n"
    "                       per attention; one process; fsc --mem shows it), from --load-weights\n"
    "                       (any --weights-format) or --resume's checkpoint (any plan of the\n"
    "                       model), else the seed's init, on the CPU. The prompt fills the\n"
    "                       caches one position at a time, then each token is one position.\n"
    "                       Each token sees the last T tokens (the model's context); past T,\n"
    "                       where the window slides, each token is a run of the sampling\n"
    "                       program on it (its own arena and copy of the weights).\n"
    "                       Prints the prompt and what follows: text for a byte-level model\n"
    "                       (V = 256) given --prompt, or with --tokenizer; else ids\n"
    "  --predict            write the model's outputs (each `output NAME`) for every sample of\n"
    "                       --data's .npy files, in order, with the params of --load-weights\n"
    "                       or --resume, by the plan's evaluation program; any world, any\n"
    "                       plan, pipelines too; on CPU ranks or GPUs as --device says\n"
    "                       (--cuda-graph, --tf32 too). Inputs no output reads (labels)\n"
    "                       may be left out\n"
    "  --out FILE.npy       where --predict writes: FILE.npy with one output, FILE.NAME.npy\n"
    "                       for each of several; one row per sample, float32 (int32 outputs:\n"
    "                       int32)\n"
    "  --no-kv-cache        sample with the sampling program instead: each token a forward of\n"
    "                       the last T tokens (what a model fsc cannot decode uses; fsc's note)\n"
    "  --prompt TEXT        the prompt's bytes, for a byte-level model\n"
    "  --prompt-ids LIST    the prompt as token ids: 464,3290,318\n"
    "  --tokenizer FILE     print the tokens as text by llm.c's gpt2_tokenizer.bin format\n"
    "  --temperature T      logits / T before the softmax (default 1.0; 0: the argmax)\n"
    "  --top-k K            draw among the K most likely tokens only (default: all)\n"
    "  --log FILE           one JSON line per step: step, loss, lr, grad_norm,\n"
    "                       tokens_per_s (classifiers: samples_per_s and accuracy), ms\n"
    "                       (with offload, to_host_bytes, to_device_bytes)\n"
    "  --log-every N        a step line every N steps (default: 1 up to 100 steps, else\n"
    "                       10), on stdout; on a terminal, on stderr above a progress bar\n"
    "  --save-weights FILE  write the params as safetensors after the last step (a\n"
    "                       pipeline: one file per stage, FILE-00001-of-00002.safetensors\n"
    "                       ..., and FILE.index.json, as Hugging Face's sharded weights)\n"
    "  --load-weights FILE  start from the params in a safetensors file, or in sharded\n"
    "                       weights by their FILE.index.json (as --save-weights writes a\n"
    "                       pipeline's, and Hugging Face's; FILE alone when only its index\n"
    "                       is there); every stage of a pipeline takes the params it has\n"
    "  --weights-format FMT names and layouts of --load-weights and --save-weights files:\n"
    "                       fsexec (default: the .fsm's names, matmul weights [in, out]),\n"
    "                       hf-gpt2 (GPT2LMHeadModel's model.safetensors), hf-llama\n"
    "                       (LlamaForCausalLM's), hf-bert (BertModel, BertForMaskedLM,\n"
    "                       BertForPreTraining), or map:FILE.json, a table of your own of\n"
    "                       (HF name, our name, transpose) rows; IN,OUT gives the two apart\n"
    "                       (hf-gpt2,fsexec: read Hugging Face's, write ours). F16/BF16\n"
    "                       files load into f32; saved files are F32 (README: Hugging Face\n"
    "                       weights)\n"
    "  --save-grads FILE    write step 1's gradients (under the params' names; world 1)\n"
    "  --checkpoint-dir DIR write checkpoints into DIR/step-NNNNNNNN/: the whole training\n"
    "                       state (params, optimizer state, step, loss scale; the data\n"
    "                       position and every random number follow from the step and\n"
    "                       the seed), every rank writing its own part as safetensors,\n"
    "                       then a manifest.json; one after the last step, and after the\n"
    "                       step a SIGINT or SIGTERM arrives in (a second one stops at once)\n"
    "  --save-every N       also a checkpoint every N steps\n"
    "  --keep K             keep the newest K checkpoints in DIR (default: all)\n"
    "  --resume PATH        continue from a checkpoint: a step directory, or the newest in\n"
    "                       a --checkpoint-dir; --steps stays the run's total (resumed at\n"
    "                       step 300 with --steps 1000: steps 301 to 1000). Any plan of the\n"
    "                       same model resumes it: another world, strategy, precision or\n"
    "                       stages reshard it as it loads. Another model (dims, params'\n"
    "                       names or shapes) is an error that lists what differs; so is\n"
    "                       no --data when the checkpoint's run read a file (another file\n"
    "                       is a warning)\n"
    "  --resume-partial     resume into another model on purpose: the params and optimizer\n"
    "                       state both have in the same shape load, the rest start as\n"
    "                       initialized (named)\n"
    "  --resume-other-data  resume onto other data on purpose (no --data: the built-in)\n"
    "  --export CKPT FILE   write the params of checkpoint CKPT (as --resume finds it) as\n"
    "                       one safetensors FILE (as --save-weights does), through a fixed\n"
    "                       16 MiB buffer, and exit; no plan needed. With another\n"
    "                       --weights-format: Hugging Face's names and layouts (every param\n"
    "                       held in memory)\n"
    "  --cpu-one-by-one     CPU ranks: run every op as its own kernel call, none of the runs\n"
    "                       of ops run as one parallel region (fused groups, the AdamW\n"
    "                       updates, the gradient norm's sums); the same bits, for comparison\n"
    "  --sync-sends         make every send between pipeline stages synchronous\n"
    "                       (MPI_Issend: done only once its receive has started), to\n"
    "                       check that the plan needs no buffering by MPI\n"
    "  --trace FILE         write a Chrome / Perfetto trace (JSON trace events; open it in\n"
    "                       ui.perfetto.dev or chrome://tracing) of some steps: every op\n"
    "                       a span on its rank (a process) and stream (compute,\n"
    "                       collectives, copies), named by op and block, with its plan op\n"
    "                       id, phase and .fsm line; one file for every rank. On CPU ranks\n"
    "                       a run of ops done as one region has its span on its first op\n"
    "                       (the others' last 0; --cpu-one-by-one to time each); CUDA ranks\n"
    "                       time ops by events, never as a CUDA graph\n"
    "  --trace-steps A:B    the steps --trace covers (default: the run's second to fourth,\n"
    "                       the first being warm-up; a run of one step: that step)\n"
    "  --debug-nan          fill every buffer with NaN outside its planned live range\n"
    "  --debug-overflow-at K  test hook, fp16 plans: make step K's gradients overflow (the\n"
    "                       step is skipped and the loss scale halved, as for a real one)\n"
    "  --debug-guard        check that every op writes only its planned buffers: canaries in\n"
    "                       the free arena and checksums of the live buffers around each op\n"
    "                       (slow); the first op that strays stops the run, named\n"
    "  --inspect PLAN       print what PLAN holds (format, model, training settings, ranks,\n"
    "                       params, inputs, blocks, ops, tensors by role, the memory plan as\n"
    "                       fsc --mem prints it, sections) and exit\n"
    "  --nproc N            start N ranks on this machine: runs `mpirun -np N\n"
    "                       --oversubscribe --bind-to none` (plus --allow-run-as-root as\n"
    "                       root; $FSEXEC_MPIRUN names another mpirun) on this fsexec with\n"
    "                       the other options; each rank gets cores/N threads unless\n"
    "                       --threads or OMP_NUM_THREADS says otherwise. mpirun runs in a\n"
    "                       process group of its own: a Ctrl-C reaches fsexec, which relays\n"
    "                       it to the ranks and exits 130 once they stop\n"
    "  --timeout SECONDS    with several ranks: end every rank when one step (or a save or\n"
    "                       load) takes longer than this, e.g. a peer died unnoticed;\n"
    "                       the waiting ranks name the rank that did not reach the\n"
    "                       collective, the plan op and its .fsm line (CUDA ranks: the\n"
    "                       NCCL call in flight and the ranks it waits for)\n"
    "                       (default 600; 0: never)\n"
    "  -h, --help           print this help and exit\n"
    "  -V, --version        print the version and exit\n"
    "\n"
    "ranks: a plan compiled for --world N runs as N processes, one per rank, started by\n"
    "(a pipeline's world is its stages x data-parallel ranks: rank r is stage r / dp,\n"
    "data-parallel index r % dp)\n"
    "  mpirun -np N fsexec PLAN ...      (Open MPI: OMPI_COMM_WORLD_*; MPICH: PMI_*)\n"
    "  srun --mpi=pmix -n N fsexec PLAN  (Slurm: SLURM_PROCID, SLURM_STEP_NUM_TASKS)\n"
    "  fsexec --nproc N PLAN ...         (this machine)\n"
    "torchrun-style RANK/WORLD_SIZE alone cannot start MPI: use one of the above. Every\n"
    "rank reads its own rows of the same global batch; rank 0 prints, logs and saves\n"
    "(weights consolidated from every rank's shards). With CUDA, rank r uses GPU\n"
    "(local rank mod GPUs) and the ranks talk through NCCL.\n"
    "\n"
    "environment (CUDA):\n"
    "  FS_CUDA_BACKEND      the backend library (default: libfs_cuda.so next to fsexec)\n"
    "  FS_CUDA_CACHE        where compiled kernels are kept (default ~/.cache/fsexec)\n"
    "  FS_CUDA_SYNC=1       wait after every op, so a kernel fault names its op (slow)\n";

typedef struct {
    const char *plan, *inspect, *data, *log, *save_weights, *load_weights, *save_grads;
    const char *checkpoint_dir, *resume, *export_from;  // --export: from this checkpoint to `plan` (the output)
    int64_t save_every, keep;
    int64_t steps;
    uint64_t seed;
    int has_seed, threads, log_every, debug_nan, debug_guard, sync_sends, one_by_one;
    int resume_partial, resume_other_data;  // --resume-partial, --resume-other-data
    int device, cuda_graph, tf32;  // device: RtDeviceKind
    RtDataOrder order;
    RtTokenFormat data_format;  // --data-format (0: auto)
    RtWeightsFormat load_format, save_format;  // --weights-format (0: fsexec)
    const char *weights_format;
    int64_t nproc, timeout;  // --nproc (0: not given), --timeout seconds
    int64_t overflow_at;     // --debug-overflow-at: the step whose fp16 gradients overflow
    const char *val_data;    // --val-data
    int64_t eval_every, eval_batches;
    int64_t sample, top_k;   // --sample N (0: train), --top-k (0: all)
    int no_kv_cache;         // --no-kv-cache: sample with the window program
    const char *prompt, *prompt_ids, *tokenizer;
    double temperature;
    const char *trace;       // --trace FILE
    int64_t trace_first, trace_last;  // --trace-steps A:B (0: the default)
    int predict;             // --predict: write the outputs for --data's samples to --out
    const char *out;         // --out FILE.npy
} Flags;

/* Who speaks in messages: "fsexec", or "[rank r] fsexec" in a world of several ranks
 * ("[rank r, stage s] fsexec" in a pipeline). */
static char who[80] = "fsexec";
static int my_rank, my_world = 1;
static RtLayout layout = {1, 1, 1, 1};  // the plan's stages x data-parallel ranks

/* A local error: with several ranks it ends them all (the others may be waiting for this
 * one in a collective); alone, the caller returns status rc. */
static int local_error(int rc)
{
    if (my_world > 1) rt_comm_abort(rc);
    return rc;
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "fsexec: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see fsexec --help)\n");
    return 2;
}

static Plan *load(const char *path)
{
    char err[512];
    Plan *p = plan_read(path, err, sizeof err);
    if (!p) fprintf(stderr, "%s: %s: %s\n", who, path, err);
    return p;
}

/* Whether f32 matrix products run on TF32 tensor cores: the plan's tf32 setting decides (its
 * attention kernels were compiled for it; codegen/cuda_flash.c); --tf32 only repeats it. */
static int plan_tf32(const Plan *p) { return plan_meta_int(p, "tf32", 0) != 0; }

/* --tf32 on a plan compiled without tf32 would run its GEMMs on TF32 and its attention in
 * f32: a mix neither setting describes. 0, or 2 after a message. */
static int check_tf32(const Flags *f, const Plan *p)
{
    if (!f->tf32 || plan_tf32(p)) return 0;
    fprintf(stderr, "%s: --tf32: %s was compiled with tf32 0, so its attention kernels compute in f32; compile it "
            "with --tf32 1 (fsc, or `tf32 1;` in the train block), and fsexec runs all of its f32 matrix products on "
            "TF32 tensor cores without this flag\n", who, f->plan);
    return 2;
}

static int inspect(const char *path)
{
    Plan *p = load(path);
    if (!p) return 1;
    printf("file          %s\n", path);
    rt_inspect(p, stdout);
    plan_free(p);
    return 0;  // a failed write to stdout is close_stdout's
}

/* A whole decimal integer in [lo, hi]. */
static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "fsexec: %s: expected an integer from %" PRId64 " to %" PRId64 ", got '%s' "
                "(see fsexec --help)\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The flags that take a value, as `--name VALUE` or `--name=VALUE`. */
typedef enum {
    V_INSPECT, V_STEPS, V_SEED, V_THREADS, V_DATA, V_DATA_ORDER, V_DATA_FORMAT, V_LOG, V_LOG_EVERY, V_SAVE_WEIGHTS,
    V_LOAD_WEIGHTS, V_SAVE_GRADS, V_NPROC, V_TIMEOUT, V_OVERFLOW_AT, V_DEVICE, V_CHECKPOINT_DIR, V_SAVE_EVERY, V_KEEP,
    V_RESUME, V_EXPORT, V_WEIGHTS_FORMAT, V_VAL_DATA, V_EVAL_EVERY, V_EVAL_BATCHES, V_SAMPLE, V_PROMPT,
    V_PROMPT_IDS, V_TOKENIZER, V_TEMPERATURE, V_TOP_K, V_TRACE,
    V_TRACE_STEPS, V_OUT, V_COUNT
} ValueFlag;

static const char *const VALUE_FLAGS[V_COUNT] = {
    "--inspect", "--steps", "--seed", "--threads", "--data", "--data-order", "--data-format", "--log", "--log-every",
    "--save-weights", "--load-weights", "--save-grads", "--nproc", "--timeout", "--debug-overflow-at", "--device",
    "--checkpoint-dir", "--save-every", "--keep", "--resume", "--export", "--weights-format", "--val-data",
    "--eval-every", "--eval-batches", "--sample", "--prompt", "--prompt-ids", "--tokenizer", "--temperature", "--top-k",
    "--trace", "--trace-steps", "--out",
};

/* 0, or the exit status of a usage error (after its message). */
static int set_value(Flags *f, ValueFlag which, const char *v)
{
    const char *flag = VALUE_FLAGS[which];
    int64_t n;
    switch (which) {
    case V_INSPECT: f->inspect = v; return 0;
    case V_STEPS: return parse_int(flag, v, 0, INT32_MAX, &f->steps) ? 2 : 0;
    case V_SEED: {
        char *end;
        errno = 0;
        f->seed = strtoull(v, &end, 0);
        if (end == v || *end || errno || v[0] == '-')
            return usage_error("--seed: expected a non-negative integer, got '%s'", v);
        f->has_seed = 1;
        return 0;
    }
    case V_THREADS:
        if (parse_int(flag, v, 1, 4096, &n)) return 2;
        f->threads = (int)n;
        return 0;
    case V_DATA: {  // repeated: one list, NAME=FILE,NAME=FILE
        static char joined[8192];
        if (!f->data) {
            f->data = v;
            return 0;
        }
        size_t had = strlen(f->data), add = strlen(v);
        if (had + add + 2 > sizeof joined) return usage_error("%s", "--data: the files' names are too long");
        memmove(joined, f->data, had);  // f->data may be joined itself
        joined[had] = ',';
        memcpy(joined + had + 1, v, add + 1);
        f->data = joined;
        return 0;
    }
    case V_DATA_ORDER:
        if (!strcmp(v, "random") || !strcmp(v, "sequential")) {
            f->order = v[0] == 'r' ? RT_ORDER_RANDOM : RT_ORDER_SEQUENTIAL;
            return 0;
        }
        return usage_error("--data-order: expected 'random' or 'sequential', got '%s'", v);
    case V_DATA_FORMAT:
        if (!strcmp(v, "auto") || !strcmp(v, "llmc") || !strcmp(v, "raw")) {
            f->data_format = v[0] == 'a' ? RT_TOKENS_AUTO : v[0] == 'l' ? RT_TOKENS_LLMC : RT_TOKENS_RAW;
            return 0;
        }
        return usage_error("--data-format: expected 'auto', 'llmc' or 'raw', got '%s'", v);
    case V_LOG: f->log = v; return 0;
    case V_LOG_EVERY:
        if (parse_int(flag, v, 1, INT32_MAX, &n)) return 2;
        f->log_every = (int)n;
        return 0;
    case V_SAVE_WEIGHTS: f->save_weights = v; return 0;
    case V_LOAD_WEIGHTS: f->load_weights = v; return 0;
    case V_SAVE_GRADS: f->save_grads = v; return 0;
    case V_NPROC: return parse_int(flag, v, 1, 4096, &f->nproc) ? 2 : 0;
    case V_TIMEOUT: return parse_int(flag, v, 0, 1000000000, &f->timeout) ? 2 : 0;
    case V_OVERFLOW_AT: return parse_int(flag, v, 1, INT32_MAX, &f->overflow_at) ? 2 : 0;
    case V_DEVICE:
        if (!strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "cuda")) {
            f->device = v[0] == 'a' ? RT_DEVICE_AUTO : v[1] == 'p' ? RT_DEVICE_CPU : RT_DEVICE_CUDA;
            return 0;
        }
        return usage_error("--device: expected 'auto', 'cpu' or 'cuda', got '%s'", v);
    case V_CHECKPOINT_DIR: f->checkpoint_dir = v; return 0;
    case V_SAVE_EVERY: return parse_int(flag, v, 1, INT32_MAX, &f->save_every) ? 2 : 0;
    case V_KEEP: return parse_int(flag, v, 1, INT32_MAX, &f->keep) ? 2 : 0;
    case V_RESUME: f->resume = v; return 0;
    case V_EXPORT: f->export_from = v; return 0;
    case V_WEIGHTS_FORMAT: {  // FMT, or IN,OUT
        char in[4096] = "", err[1024];
        const char *comma = strchr(v, ',');
        snprintf(in, sizeof in, "%.*s", comma ? (int)(comma - v) : (int)strlen(v), v);
        rt_weights_format_free(f->load_format), rt_weights_format_free(f->save_format);
        f->load_format = f->save_format = RT_WEIGHTS_FSEXEC;
        int rc = rt_weights_format_parse(in, &f->load_format, err, sizeof err);
        if (!rc) rc = rt_weights_format_parse(comma ? comma + 1 : in, &f->save_format, err, sizeof err);
        if (rc > 0) return usage_error("--weights-format: %s (IN,OUT: two of them)", err);
        if (rc < 0) fprintf(stderr, "fsexec: --weights-format: %s\n", err);
        f->weights_format = v;
        return rc ? 1 : 0;
    }
    case V_VAL_DATA: f->val_data = v; return 0;
    case V_EVAL_EVERY: return parse_int(flag, v, 1, INT32_MAX, &f->eval_every) ? 2 : 0;
    case V_EVAL_BATCHES: return parse_int(flag, v, 1, 1 << 20, &f->eval_batches) ? 2 : 0;
    case V_SAMPLE: return parse_int(flag, v, 1, 1 << 20, &f->sample) ? 2 : 0;
    case V_PROMPT: f->prompt = v; return 0;
    case V_PROMPT_IDS: f->prompt_ids = v; return 0;
    case V_TOKENIZER: f->tokenizer = v; return 0;
    case V_TEMPERATURE: {
        char *end;
        errno = 0;
        f->temperature = strtod(v, &end);
        if (end == v || *end || errno || !(f->temperature >= 0) || !isfinite(f->temperature))
            return usage_error("--temperature: expected a finite number >= 0, got '%s'", v);
        return 0;
    }
    case V_TOP_K: return parse_int(flag, v, 1, INT32_MAX, &f->top_k) ? 2 : 0;
    case V_TRACE: f->trace = v; return 0;
    case V_OUT: f->out = v; return 0;
    case V_TRACE_STEPS: {  // A:B, or A alone
        char a[32] = "";
        const char *colon = strchr(v, ':');
        snprintf(a, sizeof a, "%.*s", colon ? (int)(colon - v) : (int)strlen(v), v);
        if (parse_int(flag, a, 1, INT32_MAX, &f->trace_first) ||
            parse_int(flag, colon ? colon + 1 : a, 1, INT32_MAX, &f->trace_last))
            return 2;
        if (f->trace_last < f->trace_first)
            return usage_error("--trace-steps: expected A:B with A <= B, got '%s'", v);
        return 0;
    }
    case V_COUNT: break;
    }
    return 2;
}

/* The flags that take no value and switch one thing on. */
static const struct {
    const char *name;
    size_t at;  // offsetof the int in Flags
} SWITCHES[] = {
    {"--debug-guard", offsetof(Flags, debug_guard)}, {"--debug-nan", offsetof(Flags, debug_nan)},
    {"--cuda-graph", offsetof(Flags, cuda_graph)},   {"--tf32", offsetof(Flags, tf32)},
    {"--sync-sends", offsetof(Flags, sync_sends)},   {"--no-kv-cache", offsetof(Flags, no_kv_cache)},
    {"--cpu-one-by-one", offsetof(Flags, one_by_one)}, {"--resume-partial", offsetof(Flags, resume_partial)},
    {"--resume-other-data", offsetof(Flags, resume_other_data)}, {"--predict", offsetof(Flags, predict)},
};
#define N_SWITCHES (sizeof SWITCHES / sizeof *SWITCHES)

/* 1 when `a` is a switch (and set). */
static int switch_flag(Flags *f, const char *a)
{
    for (size_t i = 0; i < N_SWITCHES; i++)
        if (!strcmp(a, SWITCHES[i].name)) {
            *(int *)((char *)f + SWITCHES[i].at) = 1;
            return 1;
        }
    return 0;
}

/* An option fsexec does not take: a training setting or a dim, which fsc compiles into
 * the plan, says so; anything else names the closest of fsexec's own flags, found by
 * the matcher fsc's settings use (diag_closest). */
static int unknown_option(const char *a)
{
    char name[64], key[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(a, "="), a);
    snprintf(key, sizeof key, "%s", name + strspn(name, "-"));
    for (char *c = key; *c; c++)
        if (*c == '-') *c = '_';
    char msg[256];
    int n_keys;
    const ConfigKey *keys = config_keys(&n_keys);
    for (int i = 0; i < n_keys && a[1] == '-'; i++)
        if (!strcmp(key, keys[i].key)) {
            snprintf(msg, sizeof msg, "%s is a training setting, compiled into the plan by fsc: recompile the "
                     "model with fsc MODEL.fsm %s VALUE", name, name);
            return usage_error("%s", msg);
        }
    if (!strncmp(a, "-D", 2))
        return usage_error("%s sets a model dim, compiled into the plan by fsc: recompile the model with fsc "
                           "MODEL.fsm -D NAME=VALUE", a);
    const char *flags[V_COUNT + N_SWITCHES + 2] = {"--help", "--version"};
    for (int i = 0; i < V_COUNT; i++) flags[2 + i] = VALUE_FLAGS[i];
    for (size_t i = 0; i < N_SWITCHES; i++) flags[2 + V_COUNT + i] = SWITCHES[i].name;
    const char *near = diag_closest(name, flags, (int)(sizeof flags / sizeof *flags));
    if (!near) return usage_error("unknown option '%s'", a);
    snprintf(msg, sizeof msg, "unknown option '%s'; did you mean '%s'?", a, near);
    return usage_error("%s", msg);
}

static int parse_args(int argc, char **argv, Flags *f)
{
    f->steps = 100;
    f->timeout = 600;
    f->eval_batches = 10;
    f->temperature = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            exit(0);
        } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
            printf("fsexec %s (plan format %d.%d)\n", RT_VERSION, PLAN_MAJOR, PLAN_MINOR);
            exit(0);
        } else if (switch_flag(f, a)) {
            continue;
        } else if (!strcmp(a, "--")) {
            if (i + 1 < argc && f->plan) return usage_error("more than one plan given ('%s')", argv[i + 1]);
            if (i + 1 < argc) f->plan = argv[++i];
            continue;
        } else if (a[0] != '-' || !a[1]) {
            if (f->plan) return usage_error("more than one plan given ('%s')", a);
            f->plan = a;
            continue;
        }
        int which = 0;
        size_t n = 0;
        for (; which < V_COUNT; which++) {
            n = strlen(VALUE_FLAGS[which]);
            if (!strncmp(a, VALUE_FLAGS[which], n) && (a[n] == '=' || !a[n])) break;
        }
        if (which == V_COUNT) return unknown_option(a);
        if (!a[n] && i + 1 >= argc)
            return usage_error(which == V_INSPECT ? "%s needs a plan file" : "%s needs a value", a);
        int rc = set_value(f, (ValueFlag)which, a[n] ? a + n + 1 : argv[++i]);
        if (rc) return rc;
    }
    if (f->inspect && f->plan) return usage_error("--inspect takes one plan; '%s' is extra", f->plan);
    if (f->export_from && !f->plan) return usage_error("%s", "--export CKPT FILE: no output FILE given");
    if (!f->inspect && !f->plan) return usage_error("%s", "no plan given");
    if ((f->save_every || f->keep) && !f->checkpoint_dir)
        return usage_error("%s needs --checkpoint-dir DIR (where the checkpoints go)", f->save_every ? "--save-every" : "--keep");
    if ((f->resume_partial || f->resume_other_data) && !f->resume)
        return usage_error("%s says how to resume: give --resume PATH",
                           f->resume_partial ? "--resume-partial" : "--resume-other-data");
    if (f->resume && f->load_weights)
        return usage_error("%s", "--resume restores the weights with the rest of the state; drop --load-weights");
    if (f->weights_format && !f->load_weights && !f->save_weights && !f->export_from)
        return usage_error("%s", "--weights-format says how --load-weights, --save-weights and --export files are "
                           "laid out; give one of them");
    if (f->checkpoint_dir && strlen(f->checkpoint_dir) > 3000)
        return usage_error("%s", "--checkpoint-dir: path too long");
    if ((f->eval_every || f->eval_batches != 10) && !f->val_data)
        return usage_error("%s says when and how long to evaluate on --val-data FILE; give it", f->eval_every ?
                           "--eval-every" : "--eval-batches");
    if (f->no_kv_cache && !f->sample) return usage_error("%s", "--no-kv-cache is for sampling: give --sample N");
    if ((f->prompt || f->prompt_ids || f->tokenizer || f->top_k) && !f->sample)
        return usage_error("%s is for sampling: give --sample N", f->prompt ? "--prompt" : f->prompt_ids ? "--prompt-ids"
                           : f->tokenizer ? "--tokenizer" : "--top-k");
    if (f->sample && (f->prompt != NULL) == (f->prompt_ids != NULL))
        return usage_error("%s", "--sample needs one prompt: --prompt TEXT (a byte-level model) or --prompt-ids LIST");
    if (f->sample && (f->device == RT_DEVICE_CUDA || f->cuda_graph || f->tf32))
        return usage_error("%s", "--sample runs its program on the CPU; drop --device cuda, --cuda-graph and --tf32");
    if (f->sample && (f->val_data || f->save_weights || f->checkpoint_dir || f->data || f->log))
        return usage_error("--sample generates text and trains nothing; drop %s", f->val_data ? "--val-data" :
                           f->save_weights ? "--save-weights" : f->checkpoint_dir ? "--checkpoint-dir" : f->data ?
                           "--data" : "--log");
    if (f->out && !f->predict) return usage_error("%s", "--out names --predict's file: give --predict");
    if (f->predict && (!f->out || !f->data))
        return usage_error("%s", "--predict needs the samples and where their outputs go: --data NAME=FILE.npy,... and "
                           "--out FILE.npy");
    if (f->predict && !f->load_weights && !f->resume)
        return usage_error("%s", "--predict needs trained params: --load-weights FILE or --resume CKPT");
    if (f->predict && (f->val_data || f->save_weights || f->save_grads || f->checkpoint_dir || f->sample || f->log ||
                       f->trace))
        return usage_error("--predict trains nothing; drop %s", f->val_data ? "--val-data" : f->save_weights ?
                           "--save-weights" : f->save_grads ? "--save-grads" : f->checkpoint_dir ? "--checkpoint-dir" :
                           f->sample ? "--sample" : f->log ? "--log" : "--trace");
    if (f->save_grads && f->steps == 0) return usage_error("%s", "--save-grads needs at least one step");
    if (f->trace && f->steps == 0) return usage_error("%s", "--trace needs at least one step");
    if (f->trace_first && !f->trace) return usage_error("%s", "--trace-steps says which steps --trace FILE covers; give --trace");
    if (f->device == RT_DEVICE_CPU && (f->cuda_graph || f->tf32))
        return usage_error("%s needs a CUDA device (--device cuda or auto)", f->cuda_graph ? "--cuda-graph" : "--tf32");
    if (f->device == RT_DEVICE_CUDA && (f->debug_nan || f->debug_guard))
        return usage_error("%s checks the CPU backend's buffers; run it with --device cpu",
                           f->debug_nan ? "--debug-nan" : "--debug-guard");
    return 0;
}

typedef struct {
    Exec *e;               // runs the steps on the CPU, or is the device's host mirror
    RtData *data;
    Progress *progress;
    RtDevice dev;          // the backend that runs the steps (the CPU's or a device's)
    RtCheckpoint *resume;  // --resume's checkpoint, opened and checked before the run
    RtEval *eval;          // --val-data's evaluation program, or NULL
    int64_t ck_bytes;      // a checkpoint's size (rt_checkpoint_size), checked free before each save
} Run;

/* SIGINT and SIGTERM (runtime/signals.c): the first sets this, to stop the run at the next
 * step boundary (every rank agrees on which), after a checkpoint. */
static volatile sig_atomic_t *stop_signal;

/* Ends the progress display (its summary line) once; 0, or 1 after a message. */
static int end_progress(Run *r)
{
    char err[256];
    int rc = rt_progress_end(r->progress, err, sizeof err);
    r->progress = NULL;
    if (rc) fprintf(stderr, "%s: %s\n", who, err);
    return rc ? 1 : 0;
}

static void run_free(Run *r)
{
    end_progress(r);
    rt_checkpoint_close(r->resume);
    rt_device_close(&r->dev);
    rt_eval_free(r->eval);
    rt_data_close(r->data);
    rt_exec_free(r->e);
}

/* The model's params: meta "params", else each param once (by name: two stages of a
 * pipeline may hold one, as a tied embedding). */
static int64_t count_params(const Plan *p)
{
    int64_t params = plan_meta_int(p, "params", -1);
    if (params >= 0) return params;
    params = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        int seen = 0;
        for (int32_t j = 0; j < i && p->n_programs > 1 && !seen; j++)
            seen = p->tensors[j].role == PLAN_ROLE_PARAM && p->tensors[j].name == t->name && t->name != PLAN_NONE;
        if (t->role == PLAN_ROLE_PARAM && t->tied_to == PLAN_NONE && !seen) params += plan_tensor_numel(t);
    }
    return params;
}

/* The start line, by the reporting rank; p is the whole plan. */
static void start_line(const Plan *p, const Run *r, const Flags *f, uint64_t seed)
{
    int64_t params = count_params(p);
    char num[32], mem[160] = "", threads[80] = "", work_buf[32];
    for (int32_t k = 0; k < p->n_programs && layout.stages > 1; k++) {  // each stage's arena
        size_t at = strlen(mem);
        snprintf(mem + at, sizeof mem - at, "%s", k ? " / " : "");
        at = strlen(mem);
        report_bytes(p->programs[k].space_bytes[PLAN_PLACE_DEVICE], mem + at, sizeof mem - at);
    }
    if (layout.stages == 1) report_bytes(rt_exec_arena_bytes(r->e), mem, sizeof mem);
    if (layout.stages == 1 && rt_exec_space_bytes(r->e, PLAN_PLACE_HOST) > 0) {  // offload's host space
        size_t at = strlen(mem);
        snprintf(mem + at, sizeof mem - at, " + host ");
        at = strlen(mem);
        report_bytes(rt_exec_space_bytes(r->e, PLAN_PLACE_HOST), mem + at, sizeof mem - at);
    }
    if (rt_device_is_cpu(&r->dev)) {  // the CPU's threads, and the kernels' workspace outside the arena (16-bit plans)
        char work[32];
        int n = snprintf(threads, sizeof threads, " | %d thread%s", rt_threads(), rt_threads() == 1 ? "" : "s");
        if (rt_exec_work_bytes(r->e) > 0)
            snprintf(threads + n, sizeof threads - (size_t)n, " | workspace %s",
                     report_bytes(rt_exec_work_bytes(r->e), work, sizeof work));
    }
    else  // the host memory a device run takes for tensors: its mirror
        snprintf(threads, sizeof threads, " | host mirror %s",
                 report_bytes(rt_exec_host_bytes(r->e), work_buf, sizeof work_buf));
    if (r->eval) {  // the evaluation program's arena, beside the training's
        size_t at = strlen(mem);
        snprintf(mem + at, sizeof mem - at, " + eval ");
        at = strlen(mem);
        report_bytes(rt_eval_arena_bytes(r->eval), mem + at, sizeof mem - at);
    }
    char ranks[160] = "", shard[64];  // "fsdp", or with hybrid sharding "fsdp in groups of 2"
    int64_t group = plan_shard_group(p, layout.dp);
    snprintf(shard, sizeof shard, "%s", plan_meta_str(p, "shard", "?"));
    if (group < layout.dp) snprintf(shard + strlen(shard), sizeof shard - strlen(shard), " in groups of %" PRId64, group);
    if (my_world > 1 && layout.stages > 1)
        snprintf(ranks, sizeof ranks, " | %d ranks (%d stages x %d, %s)", my_world, layout.stages, layout.dp, shard);
    else if (my_world > 1)
        snprintf(ranks, sizeof ranks, " | %d ranks (%s)", my_world, shard);
    char steps[64];  // "100 steps", or resumed: "steps 301-1000"
    int64_t start = r->resume ? rt_checkpoint_step(r->resume) : 0;
    if (start) snprintf(steps, sizeof steps, "steps %" PRId64 "-%" PRId64, start + 1, f->steps);
    else snprintf(steps, sizeof steps, "%" PRId64 " step%s", f->steps, f->steps == 1 ? "" : "s");
    fprintf(stderr, "fsexec: %s | device: %s | %s params | arena %s%s%s%s | data: %s | %s, seed %"
            PRIu64 "%s%s%s\n", plan_meta_str(p, "model", "model"), r->dev.name, report_grouped(params, num, sizeof num),
            mem,
            layout.stages > 1 ? " per rank by stage" : my_world > 1 ? " per rank" : "", threads, ranks,
            rt_data_describe(r->data), steps, seed, f->debug_nan ? " | debug-nan" : f->debug_guard ? " | debug-guard" : "",
            !rt_device_is_cpu(&r->dev) && f->cuda_graph ? " | cuda-graph" : "",
            !rt_device_is_cpu(&r->dev) && plan_tf32(p) ? " | tf32" : "");
    rt_device_report(&r->dev, stderr);
}

/* --trace's steps of a run of steps start+1 .. f->steps into *first, *last: 0, or 2 after
 * a message (every rank alike; rank 0 says it). */
static int trace_steps(const Flags *f, int64_t start, int64_t *first, int64_t *last)
{
    *first = f->trace_first, *last = f->trace_last;
    if (!*first) {  // the second to the fourth step: the first warms up (page faults, NVRTC, cuBLAS)
        *first = f->steps - start >= 2 ? start + 2 : start + 1;
        *last = *first + 2 < f->steps ? *first + 2 : f->steps;
    }
    const char *why = *first <= start || *last > f->steps ? "outside the run's steps"
                      : f->overflow_at >= *first && f->overflow_at <= *last ? "include --debug-overflow-at's step"
                      : f->save_grads && *first == 1 ? "include --save-grads' step 1" : NULL;
    if (!why) return 0;
    if (my_rank == 0)
        fprintf(stderr, "%s: --trace-steps %" PRId64 ":%" PRId64 " %s (this run: steps %" PRId64 " to %" PRId64
                "), which runs apart\n", who, *first, *last, why, start + 1, f->steps);
    return 2;
}

/* The step loop (runtime/step.c); 0, or 1 after a message (an error on this rank alone
 * ends every rank). */
static int train(Run *r, const Flags *f, const char *path, uint64_t seed, int64_t start, int64_t *reached,
                 int *stopped_by)
{
    int64_t first = 0, last = 0;
    char err[512];
    if (f->trace && trace_steps(f, start, &first, &last)) return 2;
    RtTrace *trace = f->trace ? rt_trace_new(r->e, first, last, err, sizeof err) : NULL;
    if (f->trace && !trace) {
        fprintf(stderr, "%s: --trace: %s\n", who, err);
        return local_error(1);
    }
    RtCheckpointOptions co = {.dir = f->checkpoint_dir, .keep = (int)f->keep, .seed = seed,
                              .data = rt_data_describe(r->data), .data_path = f->data, .order = f->order,
                              .bytes = r->ck_bytes};
    RtTrainOptions o = {.steps = f->steps, .start = start, .checkpoint = f->checkpoint_dir ? &co : NULL,
                        .save_every = f->save_every, .stop = stop_signal, .overflow_at = f->overflow_at,
                        .save_grads = f->save_grads, .cuda_graph = f->cuda_graph, .debug_nan = f->debug_nan,
                        .who = who, .path = path, .rank = my_rank, .world = my_world, .reached = reached,
                        .stopped_by = stopped_by, .eval = r->eval, .eval_every = f->eval_every,
                        .trace = trace};
    int rc = rt_train(r->e, r->data, &r->dev, &r->progress, &o);
    if (trace && rc != RT_TRAIN_LOCAL) {  // every rank alike: the steps went, or stopped, together
        if (rt_trace_write(trace, f->trace, err, sizeof err)) {
            fprintf(stderr, "%s: --trace: %s\n", who, err);
            rc = rc ? rc : 1;
        } else if (my_rank == 0) {
            char to[32] = "";
            if (last > first) snprintf(to, sizeof to, " to %" PRId64, last);
            fprintf(stderr, "%s: trace of step%s %" PRId64 "%s in %s (open it in ui.perfetto.dev)\n", who,
                    last > first ? "s" : "", first, to, f->trace);
        }
    }
    rt_trace_free(trace);
    if (rc == RT_TRAIN_STOPPED) {  // every rank alike, for the signal any of them saw
        int reporter = (layout.stages - 1) * layout.dp, sig = rt_signal_of(*stopped_by);
        if (my_rank == reporter)
            fprintf(stderr, "%s: stopped by %s; %s\n", who, sig == SIGINT ? "SIGINT" : "SIGTERM",
                    f->checkpoint_dir ? "the checkpoint above has every step so far: continue with --resume"
                                      : "nothing saved (no --checkpoint-dir)");
        return 128 + sig;
    }
    return rc == RT_TRAIN_LOCAL ? local_error(1) : rc;
}

/* Whether the files at paths a and b are one (the same inode, through any link). */
static int same_file(const char *a, const char *b)
{
    struct stat x, y;
    return a && b && !stat(a, &x) && !stat(b, &y) && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* The input flag whose file (a --data list's too: NAME=FILE,...) is the file at out, or NULL. */
static const char *input_at(const Flags *f, const char *out, const char **file)
{
    const char *flags[] = {"the plan", "--load-weights", "--tokenizer", "--data", "--val-data"};
    const char *paths[] = {f->plan, f->load_weights, f->tokenizer, f->data, f->val_data};
    for (int i = 0; i < 5; i++) {
        for (const char *at = paths[i]; at && *at;) {
            char one[4096];
            size_t n = strcspn(at, ",");
            snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), at);
            const char *eq = i >= 3 ? strchr(one, '=') : NULL;
            if (same_file(eq ? eq + 1 : one, out) || (i < 3 && same_file(paths[i], out)))
                return *file = paths[i], flags[i];
            at += n + (at[n] == ',');
            if (i < 3) break;
        }
    }
    return NULL;
}

/* Files written after a long run (or by ranks --nproc starts) are checked before it, on
 * every rank alike: each can be written, and none is a file the run reads (written over,
 * an input would be lost). 0, or 1 after a message. */
static int check_outputs(const Flags *f)
{
    const char *flags[] = {"--save-weights", "--save-grads", "--log", "--trace", "--out"};
    const char *paths[] = {f->save_weights, f->save_grads, f->log, f->trace, f->out};
    char err[512];
    for (int i = 0; i < 5; i++) {
        const char *file, *input = paths[i] ? input_at(f, paths[i], &file) : NULL;
        if (input) {
            fprintf(stderr, "%s: %s %s is %s %s, which this run reads: give another file\n", who, flags[i], paths[i],
                    input, file);
            return 1;
        }
        if (paths[i] && plan_check_output(paths[i], err, sizeof err)) {
            fprintf(stderr, "%s: %s %s: %s\n", who, flags[i], paths[i], err);
            return 1;
        }
    }
    struct stat st;
    const char *dir = f->checkpoint_dir;
    if (dir && !stat(dir, &st)) {
        if (!S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK)) {
            fprintf(stderr, "%s: --checkpoint-dir %s: %s\n", who, dir,
                    !S_ISDIR(st.st_mode) ? "not a directory" : strerror(errno));
            return 1;
        }
    } else if (dir) {  // made by the first save: its parent must take it
        char probe[3100];
        snprintf(probe, sizeof probe, "%s", dir);
        for (size_t n = strlen(probe); n > 1 && probe[n - 1] == '/'; n--) probe[n - 1] = 0;
        if (plan_check_output(probe, err, sizeof err)) {
            fprintf(stderr, "%s: --checkpoint-dir %s: %s\n", who, dir, err);
            return 1;
        }
    }
    return 0;
}

/* What the plan needs started, for messages: "plan compiled for world 2", "the plan has 2
 * stages x 2 data-parallel ranks = world 4". */
static const char *needs(const RtLayout *l, char *buf, size_t n)
{
    char what[96];
    if (l->stages == 1) snprintf(buf, n, "plan compiled for world %d", l->world);
    else snprintf(buf, n, "the plan has %s", rt_layout_str(l, what, sizeof what));
    return buf;
}

/* The plan's world against the ranks started; 0, or 1 after a message (every rank says it). */
static int check_world(const Flags *f, const RtLayout *l, int ranks)
{
    int world = l->world;
    if (world == ranks) return 0;
    char hint[256] = "", need[128];
    if (world > 1 && ranks == 1)
        snprintf(hint, sizeof hint, " (start %d: mpirun -np %d fsexec ..., srun --mpi=pmix -n %d fsexec ..., or "
                 "fsexec --nproc %d ...)", world, world, world, world);
    else if (l->stages == 1)
        snprintf(hint, sizeof hint, " (recompile with fsc --world %d, or start %d)", ranks, world);
    else
        snprintf(hint, sizeof hint, " (start %d)", world);
    fprintf(stderr, "%s: %s: %s, but %d rank%s started%s\n", who, f->plan, needs(l, need, sizeof need), ranks,
            ranks == 1 ? "" : "s", hint);
    return 1;
}

/* What a pipeline cannot do (yet); 0, or a usage status after a message on rank 0. */
static int check_pipeline(const Flags *f, int rank)
{
    const char *flag = f->save_grads ? "--save-grads" : f->overflow_at ? "--debug-overflow-at"
                       : f->debug_guard ? "--debug-guard" : NULL;
    if (layout.stages == 1 || !flag) return 0;
    if (rank == 0)
        fprintf(stderr, "%s: %s runs plans of one pipeline stage only; this one has %d\n", who, flag, layout.stages);
    return 2;
}

/* Finds this process's rank, starts MPI for a world of several, checks the plan's world
 * and splits it into the plan's stages; 0, or an exit status after a message. A mismatch
 * is reported by every rank, and they agree before any exits: mpirun ends the job at the
 * first non-zero exit, which would cut the others short. */
static int join_world(const Flags *f, const Plan *p, RtRanks *rk)
{
    char err[512];
    if (rt_ranks_from_env(rk, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        return 1;
    }
    if (rk->world != 1) snprintf(who, sizeof who, "[rank %d] fsexec", rk->rank);
    if (rt_comm_init(rk, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", who, err);
        rt_comm_abort(1);
    }
    if (rk->world != 1) snprintf(who, sizeof who, "[rank %d] fsexec", rk->rank);
    int rc = 0;
    if (rt_plan_layout(p, &layout, err, sizeof err)) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        rc = 1;
    }
    rc = rc ? rc : check_world(f, &layout, rk->world);
    if (!rc && f->save_grads && layout.world > 1 && layout.stages == 1) {
        if (rk->rank == 0)
            fprintf(stderr, "%s: --save-grads is supported for world 1 only (with more ranks the gradients are "
                    "reduced and sharded); run a plan compiled for --world 1\n", who);
        rc = 2;
    }
    rc = rc ? rc : check_pipeline(f, rk->rank);
    if (!rc && layout.stages > 1 && plan_check_p2p(p, err, sizeof err)) {  // a pipeline that could deadlock does not start
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        rc = 1;
    }
    if ((rc = rt_comm_agree(rc))) return rc;
    if (rt_comm_layout(layout.stages, layout.dp, layout.shard, err, sizeof err)) {  // every rank alike
        fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    if (layout.stages > 1) snprintf(who, sizeof who, "[%s] fsexec", rt_comm_who());
    my_rank = rk->rank, my_world = rk->world;
    if (my_world > 1 && rt_watchdog_start((double)f->timeout, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    rt_watchdog_pipeline(p, layout.dp);
    /* Ranks that share a machine share its cores, unless told otherwise. */
    if (!f->threads && !getenv("OMP_NUM_THREADS") && rk->local_world > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        rt_set_threads(cores / rk->local_world > 1 ? (int)(cores / rk->local_world) : 1);
    }
    return 0;
}

/* The learning-rate schedule's length (fsc --steps, META "steps") against the run's
 * (--steps, the total whatever a resumed run starts at). Only a decaying schedule (cosine,
 * linear, wsd) has an end: lr_at (runtime/cpu/optim.c) holds it at min_lr past `steps`,
 * and a run cut short never gets there. A constant one, warmup or not, runs the same at
 * any length. */
static void schedule_note(const Plan *p, int64_t steps)
{
    int64_t end = plan_meta_int(p, "steps", 0);
    if (steps <= 0 || end <= 0 || end == steps || !strcmp(plan_meta_str(p, "lr_schedule", "constant"), "constant"))
        return;
    if (steps < end)
        fprintf(stderr, "fsexec: note: the learning-rate schedule runs to step %" PRId64 " (fsc --steps); this run stops "
                "at step %" PRId64 ", before it ends\n", end, steps);
    else
        fprintf(stderr, "fsexec: note: the learning-rate schedule runs to step %" PRId64 " (fsc --steps); this run goes "
                "on to step %" PRId64 ", but the schedule ended at step %" PRId64 ": the rest runs at min_lr (%g)\n",
                end, steps, end, plan_meta_float(p, "min_lr", 0));
}

/* Every rank reads the file; a failure anywhere is every rank's (the result is agreed). */
static int load_weights(Exec *e, const char *path, RtWeightsFormat fmt, char *err, size_t errlen)
{
    rt_watchdog_arm("loading the weights", -1);
    int rc = rt_load_weights_as(e, path, fmt, err, errlen);
    rt_watchdog_disarm();
    return rc;
}

/* --predict, once the params are in e, on r->dev (chosen for the eval program; rt_predict
 * opens and closes it): 0, or 1 after a message. */
static int predict(const Flags *f, const Plan *whole, Run *r, const RtRanks *rk, uint64_t seed)
{
    char err[1024] = "", written[2048];
    RtPredictOptions o = {.data = f->data, .out = f->out, .seed = seed, .dev = &r->dev, .rk = rk, .tf32 = f->tf32,
                          .graph = f->cuda_graph};
    double t0 = rt_now();
    int rc = rt_predict(whole, r->e, &o, written, sizeof written, err, sizeof err);
    if (rc && err[0]) fprintf(stderr, "%s: %s\n", who, err);
    if (rc) return rc == -2 ? local_error(1) : 1;  // -2: this rank's device failed; the others may wait in NCCL
    if (written[0]) fprintf(stderr, "%s: wrote %s in %.2f s\n", who, written, rt_now() - t0);
    return 0;
}

/* The run after the world is joined, on p, this rank's stage's program of `whole` (or
 * whole itself): the Exec (the host mirror), the data, the weights or the resumed
 * checkpoint, the device, the steps, the saved weights. 0, or an exit status after a
 * message. */
static int run_plan(Run *r, const Flags *f, const Plan *whole, const Plan *p, const RtRanks *rk, uint64_t seed)
{
    char err[512];
    int64_t start = r->resume ? rt_checkpoint_step(r->resume) : 0;
    ProgressOptions po = {.steps = f->steps, .start = start, .append = r->resume != NULL, .log_every = f->log_every,
                          .log_path = f->log, .tty = -1};
    /* --predict runs the evaluation program alone: its CUDA program and arena decide. */
    const Plan *runs = f->predict && whole->eval ? whole->eval : whole;
    int rc = rt_device_choose(&r->dev, (RtDeviceKind)f->device, f->debug_nan || f->debug_guard, runs,
                              rk->local_rank, who);
    if (rc) return rc;
    /* For a device, the Exec is its host mirror: the persistent state and the outputs
     * (--save-grads reads every gradient: then all of it). */
    int reporter = (layout.stages - 1) * layout.dp;  // rank 0, or the last stage's first: it has the logits
    ExecOptions eo = {.seed = seed, .nan_fill = f->debug_nan, .guard = f->debug_guard, .rank = rk->rank % layout.dp,
                      .world = layout.dp, .mirror = !rt_device_is_cpu(&r->dev) && !f->save_grads,
                      .whole = layout.stages > 1 ? whole : NULL, .stage = rk->rank / layout.dp,
                      .sync_sends = f->sync_sends, .one_by_one = f->one_by_one};
    if (!(r->e = rt_exec_new(p, &eo, err, sizeof err))) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        return local_error(1);
    }
    /* No step draws a batch (--steps 0: export the init, checkpoint it): inputs only .npy
     * files could feed need none. */
    int idle = f->predict || (!f->data && f->steps <= start && rt_data_kind(whole) == RT_DATA_NONE);
    r->data = idle ? rt_data_idle(err, sizeof err)
                   : rt_data_open_as(r->e, f->data, f->data_format, f->order, seed, err, sizeof err);
    if (!r->data) {
        fprintf(stderr, "%s: %s\n", who, err);
        return local_error(1);
    }
    RtEvalOptions vo = {.path = f->val_data, .format = f->data_format, .batches = f->eval_batches, .seed = seed,
                        .nan_fill = f->debug_nan};
    if (f->val_data && !(r->eval = rt_eval_new(whole, r->e, &vo, err, sizeof err))) {
        fprintf(stderr, "%s: %s\n", who, err);
        return local_error(1);
    }
    if (f->load_weights && load_weights(r->e, f->load_weights, f->load_format, err, sizeof err)) {  // agreed
        if (err[0]) fprintf(stderr, "%s: %s\n", who, err);
        return 1;
    }
    RtResumed resumed;
    double t_load = rt_now();
    if (r->resume) {
        rt_watchdog_arm("loading the checkpoint", -1);
        rc = rt_checkpoint_load_as(r->resume, r->e, f->resume_partial, &resumed, err, sizeof err);  // agreed
        rt_watchdog_disarm();
        if (rc) {
            if (err[0]) fprintf(stderr, "%s: --resume: %s\n", who, err);
            return 1;
        }
    }
    t_load = rt_now() - t_load;
    if (f->predict) return predict(f, whole, r, rk, seed);
    int32_t report[8];
    if (rt_device_open(&r->dev, r->e, rk, plan_tf32(whole), f->trace != NULL, report,
                       rt_train_reported(r->e, r->data, report)))
        return local_error(1);
    po.unit = rt_data_get_kind(r->data) == RT_DATA_LM ? "tok" : "samples";
    if ((f->steps || r->eval) && my_rank == reporter && !(r->progress = rt_progress_new(&po, err, sizeof err))) {
        fprintf(stderr, "%s: %s\n", who, err);
        return local_error(1);
    }
    if (my_rank == reporter) start_line(whole, r, f, seed), schedule_note(whole, f->steps);
    if (my_rank == reporter && r->resume) {
        char line[2048];
        rt_resumed_describe(r->resume, &resumed, whole, line, sizeof line);
        fprintf(stderr, "fsexec: %s (loaded in %.2f s)\n", line, t_load);
    }
    int64_t reached = start;
    int stopped_by = 0;
    rc = train(r, f, f->plan, seed, start, &reached, &stopped_by);
    int ended = end_progress(r), stopped = stopped_by && rc == 128 + rt_signal_of(stopped_by);
    rc = rc ? rc : ended;
    /* The weights after the last step, or after the step a signal stopped the run at. */
    rt_watchdog_arm("saving the weights", -1);
    const unsigned state = 1u << PLAN_ROLE_PARAM | 1u << PLAN_ROLE_OPT_STATE | 1u << PLAN_ROLE_MASTER;
    int save = f->save_weights && (!rc || stopped);
    if (save && rt_device_download_roles(&r->dev, r->e, state, 0)) {
        rt_device_print_error(&r->dev, 0);
        rc = local_error(1);
    }
    if (save && rt_save_weights_as(r->e, f->save_weights, reached, f->save_format, err, sizeof err)) {
        if (err[0]) fprintf(stderr, "%s: %s\n", who, err);
        rc = 1;
    }
    rt_watchdog_disarm();
    /* Stopped by the launcher's relay (fsexec --nproc): it reports the signal in its exit
     * status; a rank's non-zero one would only add mpirun's message. */
    return stopped && rc == 128 + rt_signal_of(stopped_by) && rt_signal_relayed(stopped_by) ? 0 : rc;
}

/* The checkpoint against this run's model and data (record.c), before any state is
 * read: every rank computes the same from the same files; rank 0 says it. 0, or 1. */
static int check_resume(const Flags *f, const RtCheckpoint *c, const Plan *whole)
{
    char msg[4096];
    int model = rt_resume_check_model(c, whole, msg, sizeof msg);
    if (model && my_rank == 0)
        fprintf(stderr, "%s: --resume: %s%s\n", model > 0 && f->resume_partial ? "fsexec: note" : "fsexec", msg,
                model < 0           ? ""
                : f->resume_partial ? "; --resume-partial: what both have in the same shape loads, the rest starts "
                                      "as initialized"
                                    : "; give --resume-partial to load what both have in the same shape on purpose "
                                      "(the rest starts as initialized)");
    if (model < 0 || (model > 0 && !f->resume_partial)) return 1;
    if (f->predict) return 0;  // --data is the samples to predict, not the run's data
    int data = rt_resume_check_data(c, f->data, f->resume_other_data, msg, sizeof msg);
    if (data && my_rank == 0) fprintf(stderr, "fsexec: %s--resume: %s\n", data < 0 ? "" : "warning: ", msg);
    return data < 0 ? 1 : 0;
}

/* Before any step: no output is a file of --resume's checkpoint, and --checkpoint-dir
 * holds only fsexec's own files under a checkpoint's names, with room for one more
 * (rank 0 looks; every rank agrees). 0, or 1 after a message. */
static int check_checkpoint_files(const Flags *f, Run *r, const Plan *whole)
{
    const char *flags[] = {"--save-weights", "--save-grads", "--log", "--trace"};
    const char *paths[] = {f->save_weights, f->save_grads, f->log, f->trace};
    char err[512];
    int rc = 0;
    for (int i = 0; i < 4 && r->resume && !rc; i++) {
        const char *own = paths[i] ? rt_checkpoint_holds(r->resume, paths[i]) : NULL;
        if (own && my_rank == 0)
            fprintf(stderr, "%s: %s %s is %s/%s, a file of the checkpoint this run resumes: give another file\n", who,
                    flags[i], paths[i], rt_checkpoint_dir(r->resume), own);
        rc = own ? 1 : 0;
    }
    if (!rc && f->checkpoint_dir && my_rank == 0) {
        r->ck_bytes = rt_checkpoint_size(whole, err, sizeof err);
        if (r->ck_bytes < 0 || rt_checkpoint_check_dir(f->checkpoint_dir, r->ck_bytes, err, sizeof err)) {
            fprintf(stderr, "%s: --checkpoint-dir %s: %s\n", who, f->checkpoint_dir, err);
            rc = 1;
        }
    }
    return rt_comm_agree(rc);
}

static int run(const Flags *f)
{
    Plan *whole = load(f->plan), *one = NULL;  // one: this rank's stage's program, in a pipeline
    if (!whole) return 1;
    if (check_tf32(f, whole)) {
        plan_free(whole);
        return 2;
    }
    RtRanks rk;
    char err[512];
    int rc = join_world(f, whole, &rk);
    if (!rc && layout.stages > 1 && !(one = plan_extract_program(whole, rk.rank / layout.dp, err, sizeof err))) {
        fprintf(stderr, "%s: %s: %s\n", who, f->plan, err);
        rc = local_error(1);
    }
    Run r = {0};
    if (!rc && f->resume) {  // every rank opens and checks it; they agree before any goes on
        rt_watchdog_arm("opening the checkpoint", -1);
        r.resume = rt_checkpoint_open(f->resume, err, sizeof err);
        rt_watchdog_disarm();
        if (!r.resume) fprintf(stderr, "%s: --resume: %s\n", who, err);
        rc = rt_comm_agree(r.resume ? 0 : 1);
    }
    if (!rc) rc = check_checkpoint_files(f, &r, whole);
    if (!rc && r.resume) rc = check_resume(f, r.resume, whole);
    if (!rc && r.resume && rt_checkpoint_step(r.resume) >= f->steps && !f->predict) {
        if (my_rank == 0)
            fprintf(stderr, "fsexec: %s is at step %" PRId64 " and --steps %" PRId64 " is the run's total: nothing to "
                    "run (give a larger --steps to go on)\n", rt_checkpoint_dir(r.resume), rt_checkpoint_step(r.resume),
                    f->steps);
    } else if (!rc) {
        rt_set_threads(f->threads);
        uint64_t seed = f->has_seed ? f->seed
                        : r.resume ? rt_checkpoint_seed(r.resume) : (uint64_t)plan_meta_int(whole, "seed", 0);
        stop_signal = rt_signals_catch(who, my_rank);
        rc = run_plan(&r, f, whole, one ? one : whole, &rk, seed);
    }
    run_free(&r);
    rt_comm_finalize();
    plan_free(one);
    plan_free(whole);
    return rc;
}

/* --prompt-ids 1,2,3 into ids (at most max); the count, or -1 after a message. */
static int64_t parse_ids(const char *s, int32_t *ids, int64_t max)
{
    int64_t n = 0;
    for (const char *at = s;; at++) {
        char *end;
        errno = 0;
        long long v = strtoll(at, &end, 10);
        if (end == at || errno || v < 0 || v > INT32_MAX || (*end && *end != ',') || n == max) {
            fprintf(stderr, "fsexec: --prompt-ids: expected token ids such as 464,3290,318 (at most %" PRId64 "), got "
                    "'%s'\n", max, s);
            return -1;
        }
        ids[n++] = (int32_t)v;
        if (!*end) return n;
        at = end;
    }
}

/* The prompt and the tokens after it: text (bytes, or a tokenizer's) or ids. */
static int print_sample(const Flags *f, const RtTokenizer *tk, int64_t V, const int32_t *ids, int64_t n)
{
    int text = tk || (f->prompt && V == 256), bad = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        if (tk) bad = rt_tokenizer_print(tk, ids[i], stdout);
        else if (text) bad = putchar(ids[i]) == EOF;
        else bad = printf("%s%d", i ? " " : "", ids[i]) < 0;
    }
    return bad || putchar('\n') == EOF;
}

/* The weights into the sampling program: a file or a checkpoint; 0, or 1 after a message. */
static int sample_weights(const Flags *f, Exec *e, RtCheckpoint *c)
{
    char err[1024];
    RtResumed r;
    if (f->load_weights && rt_load_weights_as(e, f->load_weights, f->load_format, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        return 1;
    }
    if (c && rt_checkpoint_load(c, e, &r, err, sizeof err)) {
        fprintf(stderr, "fsexec: --resume: %s\n", err);
        return 1;
    }
    return 0;
}

/* fsexec PLAN --sample N: 0, or an exit status after a message. */
static int sample(const Flags *f)
{
    char err[1024];
    RtRanks rk;
    if (rt_ranks_from_env(&rk, err, sizeof err) || rk.world != 1) {
        fprintf(stderr, "fsexec: --sample runs in one process, not as rank %d of %d; start it without mpirun\n", rk.rank,
                rk.world);
        return 2;
    }
    Plan *whole = load(f->plan);
    RtCheckpoint *c = whole && f->resume ? rt_checkpoint_open(f->resume, err, sizeof err) : NULL;
    if (whole && f->resume && !c) fprintf(stderr, "fsexec: --resume: %s\n", err);
    uint64_t seed = f->has_seed ? f->seed : c ? rt_checkpoint_seed(c) : whole ? (uint64_t)plan_meta_int(whole, "seed", 0) : 0;
    RtSampler *s = whole && (c || !f->resume) ? rt_sampler_new(whole, seed, !f->no_kv_cache, err, sizeof err) : NULL;
    if (whole && (c || !f->resume) && !s) fprintf(stderr, "fsexec: %s: %s\n", f->plan, err);
    RtTokenizer *tk = s && f->tokenizer ? rt_tokenizer_open(f->tokenizer, err, sizeof err) : NULL;
    if (s && f->tokenizer && !tk) fprintf(stderr, "fsexec: --tokenizer %s\n", err);
    int rc = !s || (f->tokenizer && !tk) || sample_weights(f, rt_sampler_exec(s), c);
    int64_t V = s ? rt_sampler_vocab(s) : 0, T = s ? rt_sampler_context(s) : 0, max = 1 << 20, n = 0;
    int32_t *ids = rc ? NULL : malloc(sizeof *ids * (size_t)(max + f->sample));
    if (!rc && !ids) fprintf(stderr, "fsexec: out of memory\n");
    rc = rc || !ids;
    if (!rc && f->prompt && V != 256) {
        fprintf(stderr, "fsexec: --prompt TEXT is a byte-level model's prompt (V = 256); this one's vocab is %" PRId64
                ": give --prompt-ids\n", V);
        rc = 2;
    } else if (!rc && f->prompt) {
        for (const char *b = f->prompt; *b && n < max; b++) ids[n++] = (unsigned char)*b;
    } else if (!rc && (n = parse_ids(f->prompt_ids, ids, max)) < 0) {
        rc = 2;
    }
    Exec *window = NULL;  // the sampling program, past T tokens with a KV cache: weights of its own
    if (!rc && rt_sampler_window(s, n + f->sample, &window, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        rc = 1;
    }
    if (!rc && window) rc = sample_weights(f, window, c);
    RtSampleOptions so = {.n = f->sample, .temperature = f->temperature, .top_k = f->top_k, .seed = seed};
    if (!rc && n + f->sample > T)
        fprintf(stderr, "fsexec: note: the model's context is T = %" PRId64 " tokens; past it each token sees the last %"
                PRId64 " (as nanoGPT crops)\n", T, T);
    if (!rc && rt_sample(s, &so, ids, n, ids + n, err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        rc = 1;
    }
    if (!rc) rc = print_sample(f, tk, V, ids, n + f->sample);
    free(ids);
    rt_tokenizer_free(tk);
    rt_sampler_free(s);
    rt_checkpoint_close(c);
    plan_free(whole);
    return rc;
}

/* --nproc N against the plan's world, before any rank starts; 0, or 1 after a message. */
static int check_nproc(const Flags *f)
{
    Plan *p = load(f->plan);
    if (!p) return 1;
    RtLayout l;
    char err[512], need[128], fix[64] = "run it without --nproc", again[64] = "";
    int rc = rt_plan_layout(p, &l, err, sizeof err);
    plan_free(p);
    if (rc) {
        fprintf(stderr, "fsexec: %s: %s\n", f->plan, err);
        return 1;
    }
    if (l.world == f->nproc) return 0;
    if (l.world > 1) snprintf(fix, sizeof fix, "use --nproc %d", l.world);
    if (l.stages == 1) snprintf(again, sizeof again, ", or recompile with fsc --world %" PRId64, f->nproc);
    fprintf(stderr, "fsexec: %s: %s, but --nproc asks for %" PRId64 " ranks; none started (%s%s)\n", f->plan,
            needs(&l, need, sizeof need), f->nproc, fix, again);
    return 1;
}

/* fsexec --export CKPT FILE: 0, or 1 after a message. */
static int export_checkpoint(const char *from, const char *out, RtWeightsFormat format)
{
    char err[1024];
    double t0 = rt_now();
    RtCheckpoint *c = rt_checkpoint_open(from, err, sizeof err);
    int64_t buffer = 0;
    int rc = !c || rt_checkpoint_export(c, out, format, &buffer, err, sizeof err);
    if (rc) fprintf(stderr, "fsexec: --export: %s\n", err);
    else
        fprintf(stderr, "fsexec: exported the params of %s (step %" PRId64 ") to %s (%s names) in %.2f s, %s a %.0f "
                "MiB buffer\n", rt_checkpoint_dir(c), rt_checkpoint_step(c), out, rt_weights_format_name(format),
                rt_now() - t0, format == RT_WEIGHTS_FSEXEC ? "through" : "holding the params in", (double)buffer / (1 << 20));
    rt_checkpoint_close(c);
    return rc ? 1 : 0;
}

/* fsexec --nproc N: the same command as N ranks under mpirun; its exit status. */
static int launch(const Flags *f, int argc, char **argv)
{
    RtRanks rk;
    char err[512], exe[PATH_MAX], threads[32], np[32];
    if (rt_ranks_from_env(&rk, err, sizeof err) || rk.world != 1) {
        fprintf(stderr, "fsexec: --nproc starts ranks, but this process already is rank %d of %d (%s); drop "
                "--nproc\n", rk.rank, rk.world, rt_launch_name(rk.launch));
        return 2;
    }
    if (check_nproc(f)) return 1;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0) {
        fprintf(stderr, "fsexec: --nproc: cannot find this program's path: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = 0;
    const char *mpirun = getenv("FSEXEC_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    if (!getenv("OMP_NUM_THREADS")) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        snprintf(threads, sizeof threads, "%ld", cores / f->nproc > 1 ? cores / f->nproc : 1);
        setenv("OMP_NUM_THREADS", threads, 1);
    }
    char **args = malloc(sizeof *args * (size_t)argc);
    const char **av = malloc(sizeof *av * (size_t)(argc + 20));
    if (!args || !av) {
        fprintf(stderr, "fsexec: out of memory\n");
        return 1;
    }
    int n_args = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) i++;
        else if (strncmp(argv[i], "--nproc=", 8)) args[n_args++] = argv[i];
    }
    rt_launch_argv(mpirun, exe, (int)f->nproc, geteuid() == 0, args, n_args, av, argc + 20, np, sizeof np);
    int rc = rt_launch_run(av, err, sizeof err);
    if (rc < 0) fprintf(stderr, "fsexec: --nproc %" PRId64 ": %s\n", f->nproc, err);
    free(args);
    free(av);
    return rc < 0 ? 1 : rc;
}

/* Registered first, so it runs last at exit: a failed write to stdout (a full disk) is an
 * error whatever the command printed, --help included. */
static void close_stdout(void)
{
    char err[128];
    if (plan_stdout_close(err, sizeof err)) {
        fprintf(stderr, "fsexec: %s\n", err);
        _exit(1);
    }
}

int main(int argc, char **argv)
{
    plan_stdout_open();
    atexit(close_stdout);
    Flags f = {0};
    int rc = parse_args(argc, argv, &f);
    if (rc) return rc;
    if (f.inspect) rc = inspect(f.inspect);
    else if (f.export_from) rc = export_checkpoint(f.export_from, f.plan, f.save_format);
    else if (check_outputs(&f)) rc = 1;
    else if (f.sample && f.nproc > 1) rc = usage_error("%s", "--sample runs in one process; drop --nproc");
    else if (f.nproc > 1) rc = launch(&f, argc, argv);
    else rc = f.sample ? sample(&f) : run(&f);
    rt_weights_format_free(f.load_format);
    rt_weights_format_free(f.save_format);
    return rc;
}
