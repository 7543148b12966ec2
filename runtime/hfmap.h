/* runtime/hfmap.h: a table of Hugging Face names against ours (runtime/hfmap.c reads
 * them: the built-in hf-gpt2, hf-llama and hf-bert, and a user's map:FILE.json), as
 * runtime/hf.c walks them. Private to the runtime. */
#ifndef FS_RT_HFMAP_H
#define FS_RT_HFMAP_H

#include <jansson.h>

#include "runtime.h"

/* How a row's bytes go between HF's tensor and our param:
 *   COPY       the same layout
 *   TRANSPOSE  HF's nn.Linear weight [out, in] against our [in, out]
 *   TIED       a copy HF may keep of another of our params (GPT-2's lm_head.weight is
 *              wte): on load it must equal its source, bit for bit; never written
 *   BUFFER     a tensor HF keeps that is not a param (a causal mask): skipped, never written */
typedef enum { HF_COPY, HF_TRANSPOSE, HF_TIED, HF_BUFFER } HfHow;

typedef struct {
    const char *ours;        // our param ({N}: the block index); NULL for a buffer
    const char *hf;          // HF's tensor
    HfHow how;
    int optional;            // a file's tensor of a param the model has not is skipped, not an error
    const char *if_missing;  // added to "no tensor ..." ("" when none)
    const char *if_shape;    // added to a shape mismatch that is not a transpose ("" when none)
} HfRow;

struct RtHfMap {
    const char *name;        // "hf-gpt2", or "map:FILE.json"
    const char *model;       // "GPT-2": "not a GPT-2 file"
    const char *covers;      // what its names are: "samples/gpt2.fsm"
    const char *prefix;      // what a base model's file lacks ("transformer."), or ""
    const char *layout;      // HF's matmul layout against ours, for messages
    const char *flipped;     // a guess for a file holding the transpose, for messages
    int user;                // a map:FILE: each of its params' rows must name a param of the model
    HfRow *rows;
    int n;
    json_t *root;            // owns every string above
    char *label;             // owns name when it is made
};

#endif
