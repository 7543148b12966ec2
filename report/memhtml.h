/* report/memhtml.h: shared by the two files of the HTML report (internal to report/). */
#ifndef FS_MEMHTML_H
#define FS_MEMHTML_H

#include <stdio.h>

#include "report.h"

/* s with &, <, >, " and ' escaped, for text and attribute values alike. */
void html_text(FILE *out, const char *s);
/* The timeline, as an inline <svg> (report/memsvg.c). 0, or -1 when out of memory. */
int report_html_chart(const MemReport *r, FILE *out);

#endif
