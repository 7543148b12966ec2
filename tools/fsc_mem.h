/* tools/fsc_mem.h: fsc's memory reports (--mem, --mem=json, --mem=html FILE) and the
 * --mem-limit check, with its what-ifs: the compiler run again, in process, with one
 * setting changed, to tell the user what each would save. */
#ifndef FS_FSC_MEM_H
#define FS_FSC_MEM_H

#include "frontend.h"
#include "plan.h"

typedef enum { MEM_OUT_NONE, MEM_OUT_TEXT, MEM_OUT_JSON, MEM_OUT_HTML } MemOut;

typedef struct {
    MemOut out;
    const char *html_path;       // MEM_OUT_HTML: where the page goes
    const char *compare;         // a plan file to overlay on the page, or NULL
    int64_t limit;               // --mem-limit in bytes; 0: none
    const char *limit_text;      // as the user typed it
    const char *src;             // the model source, to compile again for what-ifs
    size_t len;
    const char *path;            // its file name
    const FrontendOptions *fo;   // the command line's -D and settings
    int quiet;
} FscMem;

/* The plan's source file name as the plan records it (meta "source": the base name). */
int fsc_set_source(Plan *p, const char *path);
/* Prints the reports asked for and checks the limit on plan p (built in memory).
 * 0, or 1 after a message (over the limit, a file that cannot be written). */
int fsc_mem(const Plan *p, const FscMem *m);

#endif
