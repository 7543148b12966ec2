#!/bin/sh
# tests/docs/examples.sh FSC DOC.md...: every ```fsm fenced example of the docs must
# compile with fsc, so that the docs cannot drift from the language. A fenced block with
# no language tag that holds a `model NAME {` is an error too (an example that escapes
# the check). Exit status 1 on any failure; the failing example's fsc errors are shown
# with its line in the doc.
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 FSC DOC.md..." >&2
    exit 2
fi
fsc=$1
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/fs-docs.XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
failures=0 count=0
for doc in "$@"; do
    # Writes each ```fsm block to $dir/N.fsm and its first line number to $dir/N.line;
    # prints "untagged LINE" for an untagged block that declares a model.
    awk -v dir="$dir" -v base="$count" '
        /^```/ {
            if (!inside) {
                inside = 1; tag = substr($0, 4); start = NR + 1; body = ""; next
            }
            inside = 0
            if (tag == "fsm") {
                n++; f = dir "/" (base + n) ".fsm"
                printf "%s", body > f; close(f)
                print start > (dir "/" (base + n) ".line"); close(dir "/" (base + n) ".line")
            } else if (tag == "" && body ~ /(^|\n)[ \t]*model[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*\{/) {
                print "untagged " start
            }
            next
        }
        inside { body = body $0 "\n" }
        END { if (inside) print "unclosed " start; print "count " base + n }
    ' "$doc" > "$dir/report" || exit 2
    while read -r what line; do
        case $what in
        untagged) echo "FAIL $doc:$line: a fenced block declares a model but is not tagged fsm"; failures=$((failures + 1)) ;;
        unclosed) echo "FAIL $doc:$line: unclosed fenced block"; failures=$((failures + 1)) ;;
        count) new=$line ;;
        esac
    done < "$dir/report"
    i=$((count + 1))
    while [ "$i" -le "$new" ]; do
        line=$(cat "$dir/$i.line")
        if out=$("$fsc" "$dir/$i.fsm" -q 2>&1); then
            echo "ok   $doc:$line: the example compiles"
        else
            echo "FAIL $doc:$line: the example does not compile:"
            printf '%s\n' "$out" | sed 's/^/    /'
            failures=$((failures + 1))
        fi
        i=$((i + 1))
    done
    count=$new
done
if [ "$count" -eq 0 ]; then
    echo "FAIL: no fsm example in $*"
    exit 1
fi
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all $count examples compile"
