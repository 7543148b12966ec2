/* report/memhtml.h: shared by the two files of the HTML report (internal to report/). */
#ifndef FS_MEMHTML_H
#define FS_MEMHTML_H

#include <stdio.h>

#include "report.h"

/* s with &, <, >, " and ' escaped, for text and attribute values alike (report/htmltext.c). */
void html_text(FILE *out, const char *s);
/* The timeline, as an inline <svg> with its zoom script and the phases' legend
 * (report/memsvg.c); cmp (or NULL): another plan's report, overlaid. 0, or -1 when out
 * of memory. */
int report_html_chart(const MemReport *r, const MemReport *cmp, FILE *out);
/* 1, 2, 2.5 or 5 times a power of ten, at least x: an axis step (report/memsvg.c). */
double report_html_nice(double x);
/* The schedule as a lane per stage, an inline <svg>, and its numbers (report/timesvg.c).
 * 0, or -1 when the write fails. */
int report_html_lanes(const Timeline *t, FILE *out);
/* The CSS rules of the lanes, inside the page's <style>. */
void report_html_lanes_style(FILE *out);

#endif
