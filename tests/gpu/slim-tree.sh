#!/usr/bin/env bash
# Takes the what-if harness's recorded results out of the git index for the duration of device
# calls, and puts them back.
#
# Why: a device call sends every tracked file (64 MiB in all with what it carries). The kept
# recordings (tests/gpu/whatif/results*/*.tar, about 46 MiB) leave too little room for the
# release binary. No check of tests/gpu/run.sh reads them, so a call does not need them.
#
#   bash tests/gpu/slim-tree.sh out    # before the calls: untrack and ignore the tars
#   bash tests/gpu/slim-tree.sh back   # after them: track them again, exactly as before
#   bash tests/gpu/slim-tree.sh status # which state the tree is in
#
# Nothing committed changes and the files stay on disk. While they are out, `git status` shows
# them as staged deletions: commit only with explicit paths (`git commit -- PATHS`), or run
# `back` first. `out` refuses to run when anything is already staged, so `back` can restore
# the index exactly.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
exclude="$(git rev-parse --git-path info/exclude)"
# The marker line that brackets what `out` adds to .git/info/exclude, so `back` removes
# exactly those lines and nothing a person put there.
marker="# gpumem slim-tree: recorded results out of the index"

is_out() { grep -qxF "$marker" "$exclude" 2>/dev/null; }

case "${1:-}" in
out)
    if is_out; then
        echo "slim-tree: already out" >&2
        exit 1
    fi
    if ! git diff --cached --quiet; then
        echo "slim-tree: the index has staged changes; commit or unstage them first" >&2
        exit 1
    fi
    mapfile -t tars < <(git ls-files -- 'tests/gpu/whatif/results*/*.tar')
    if [ "${#tars[@]}" -eq 0 ]; then
        echo "slim-tree: no tracked recordings under tests/gpu/whatif/" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$exclude")"
    {
        echo "$marker"
        printf '/%s\n' "${tars[@]}"
        echo "$marker end"
    } >>"$exclude"
    git rm -q --cached -- "${tars[@]}"
    echo "slim-tree: ${#tars[@]} recordings out of the index; tracked tree now $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
    ;;
back)
    if ! is_out; then
        echo "slim-tree: not out" >&2
        exit 1
    fi
    # The tars `out` listed, read back from between the markers.
    mapfile -t tars < <(awk -v m="$marker" '$0 == m { on = 1; next } $0 == m " end" { on = 0 } on { print substr($0, 2) }' "$exclude")
    kept=$(awk -v m="$marker" '$0 == m { on = 1; next } $0 == m " end" { on = 0; next } !on' "$exclude")
    printf '%s' "$kept${kept:+$'\n'}" >"$exclude"
    git reset -q -- "${tars[@]}"
    echo "slim-tree: ${#tars[@]} recordings tracked again"
    ;;
status)
    if is_out; then echo out; else echo in; fi
    ;;
*)
    echo "usage: bash tests/gpu/slim-tree.sh out|back|status" >&2
    exit 2
    ;;
esac
