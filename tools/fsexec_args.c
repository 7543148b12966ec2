/* tools/fsexec_args.c: fsexec's command line into Flags: the --help text, each flag's
 * value parsed and range-checked, the flags checked against each other, and the files the
 * run will write checked before it starts. Invariants: a usage error is one line,
 * `fsexec: ... (see fsexec --help)`, and exit status 2 (an unreadable --weights-format map
 * and check_outputs' findings: 1); -h and -V print and exit 0; nothing here reads a plan
 * or starts MPI (check_outputs runs before any rank starts, and on every rank alike). Sits
 * first: main (tools/fsexec.c) calls parse_args, then check_outputs, then a mode.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsexec.h"
#include "ir.h"  // config_keys and diag_closest: fsc's settings and its matcher

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
    "  --save-grads FILE    write step 1's gradients (under the params' names; world 1;\n"
    "                       fp16's unscaled, as f32; not with --offload, whose step never\n"
    "                       holds them all)\n"
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

int parse_args(int argc, char **argv, Flags *f)
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
        return usage_error("%s needs --checkpoint-dir DIR (where the checkpoints go)",
                           f->save_every ? "--save-every" : "--keep");
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
        return usage_error("%s is for sampling: give --sample N", f->prompt ? "--prompt"
                           : f->prompt_ids ? "--prompt-ids" : f->tokenizer ? "--tokenizer" : "--top-k");
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
    if (f->trace_first && !f->trace)
        return usage_error("%s", "--trace-steps says which steps --trace FILE covers; give --trace");
    if (f->device == RT_DEVICE_CPU && (f->cuda_graph || f->tf32))
        return usage_error("%s needs a CUDA device (--device cuda or auto)", f->cuda_graph ? "--cuda-graph" : "--tf32");
    if (f->device == RT_DEVICE_CUDA && (f->debug_nan || f->debug_guard))
        return usage_error("%s checks the CPU backend's buffers; run it with --device cpu",
                           f->debug_nan ? "--debug-nan" : "--debug-guard");
    return 0;
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
int check_outputs(const Flags *f)
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
