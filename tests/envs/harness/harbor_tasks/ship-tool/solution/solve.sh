#!/bin/bash
# The reference solution of a task whose solution/ holds more than solve.sh: a helper it runs
# directly (so it must arrive executable), a script with quotes and a heredoc, a binary file and a
# file without a final newline (so each must arrive byte for byte).
set -e
here="$(dirname "$0")"
app="${APP:-/app}"
mkdir -p "$app/bin" "$app/data"
"$here/lib/install.sh" "$here/bin/greet" "$app/bin/greet"
cp "$here/data/table.bin" "$here/data/note.txt" "$app/data/"
