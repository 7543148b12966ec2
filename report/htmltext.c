/* report/htmltext.c: text escaped for the HTML report's pages (memhtml.c) and its inline
 * SVG (memsvg.c): a file of its own, so that neither includes the other's definitions. */
#include "memhtml.h"

void html_text(FILE *out, const char *s)
{
    for (; *s; s++) switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&#39;", out); break;
        default: fputc(*s, out);
        }
}
