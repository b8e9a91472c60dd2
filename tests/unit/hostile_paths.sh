#!/usr/bin/env bash
# Outputs never escape the paths given, and checkpoint pointers cannot send a resume elsewhere
# (issue 58; tests/hostile.bash: a probe fails on a hang, a signal, memory over its bound or any
# change in $OUTSIDE), through the real CLI on a single-process `tessera train` of the tiny preset:
#  - links planted at every name a save and a run write (latest.tmp, step-<N>.tmp, run_info.json,
#    report.html, a trace, the kernel trace's temporary) are replaced, never written through; the
#    run succeeds;
#  - a metrics.jsonl that is a link or a FIFO, and a log.dir/flight that is a link, are refused in
#    one line naming them (exit 2); an ordinary metrics.jsonl is appended to by a resumed run;
#  - `latest` naming an absolute path, a "../" path, or a step-<N> that is a link to a checkpoint
#    outside checkpoint.dir is refused in one line naming the file and what it holds (train's
#    resume, and `ckpt verify` of the directory); a plain `step-<N>` resumes;
#  - `report --out` refuses an existing file that is not a Tessera report, and a link, unless
#    --force; --force replaces the link itself, never its target; a report is replaced.
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../hostile.bash"
hostile_setup
on_fail() { ls -lR "$T/ck" "$T/run" 2>/dev/null | head -50; cat "$T/err" 2>/dev/null | head -20; }

python3 -c 'import sys; open(sys.argv[1], "w").write("\n\n".join(" ".join("w%d" % ((7 * d + 3 * i) % 50) for i in range(80)) for d in range(40)))' "$T/small.txt"
TRAIN=("$BIN" train --set data.path="$T/small.txt" --set data.seq_len=32 --set train.micro_batch=1 --set train.warmup_steps=1
       --set checkpoint.dir="$T/ck" --set checkpoint.every=1 --set log.dir="$T/run")

# ---- a save and a run never write through a link planted at their names ---------------------
mkdir -p "$T/ck" "$T/run"
ln -s "$OUTSIDE/precious.txt" "$T/ck/latest.tmp"
ln -s "$OUTSIDE/sub" "$T/ck/step-1.tmp"
ln -s "$OUTSIDE/link" "$T/ck/step-2.tmp"
ln -s "$OUTSIDE/precious.txt" "$T/run/run_info.json"
ln -s "$OUTSIDE/sub/also.txt" "$T/run/report.html"
ln -s "$OUTSIDE/precious.txt" "$T/run/trace-rank-0.json"
ln -s "$OUTSIDE/precious.txt" "$T/run/kernels-rank-0.json.tmp"  # the kernel trace's temporary
probe 0 '' 1024 "${TRAIN[@]}" --set train.steps=2 --set train.profile_steps=[1,2]
check "latest names step-2, a regular file" test "$(cat "$T/ck/latest")" = step-2 -a ! -L "$T/ck/latest"
check "no temporary left" test -z "$(ls -A "$T/ck" | grep tmp)"
for f in run_info.json report.html trace-rank-0.json; do
  check "$f replaced the link with a regular file" test -f "$T/run/$f" -a ! -L "$T/run/$f"
done
check "the kernel trace's temporary: the link unlinked, nothing left" test ! -e "$T/run/kernels-rank-0.json.tmp" -a ! -L "$T/run/kernels-rank-0.json.tmp"

# ---- log.dir's files that are appended to: refused when a link or a FIFO -------------------
mkdir -p "$T/run2"
ln -s "$OUTSIDE/precious.txt" "$T/run2/metrics.jsonl"
probe 2 "metrics file $T/run2/metrics.jsonl for appending: it is a symbolic link to '$OUTSIDE/precious.txt'" 1024 \
  "${TRAIN[@]}" --set train.steps=1 --set log.dir="$T/run2" --set checkpoint.dir="$T/ck2"
rm "$T/run2/metrics.jsonl" && mkfifo "$T/run2/metrics.jsonl"
probe 2 "metrics.jsonl for appending: it is a FIFO, not a regular file" 1024 \
  "${TRAIN[@]}" --set train.steps=1 --set log.dir="$T/run2" --set checkpoint.dir="$T/ck2"
mkdir -p "$T/run3" && ln -s "$OUTSIDE/sub" "$T/run3/flight"
probe 2 "flight recorder directory '$T/run3/flight' is a symbolic link, not a directory: refused" 1024 \
  "${TRAIN[@]}" --set train.steps=1 --set log.dir="$T/run3" --set checkpoint.dir="$T/ck3"

# ---- latest names a step-<N> of checkpoint.dir, nothing else --------------------------------
cp -r "$T/ck/step-2" "$OUTSIDE/step-2"  # a checkpoint outside, which a pointer might name
outside_state >"$T/outside.state"
want="; it must be one line naming a step-<N> directory of checkpoint.dir $T/ck: refused (a checkpoint elsewhere is resumed with --resume DIR)"
echo "$OUTSIDE/step-2" >"$T/ck/latest"
probe 2 "$T/ck/latest names '$OUTSIDE/step-2'$want" 1024 "${TRAIN[@]}" --set train.steps=3
echo "../outside/step-2" >"$T/ck/latest"
probe 2 "$T/ck/latest names '../outside/step-2'$want" 1024 "${TRAIN[@]}" --set train.steps=3
echo step-9 >"$T/ck/latest" && ln -s "$OUTSIDE/step-2" "$T/ck/step-9"
probe 2 "checkpoint $T/ck/step-9 is a symbolic link to '$OUTSIDE/step-2', not a directory of checkpoint.dir $T/ck" 1024 \
  "${TRAIN[@]}" --set train.steps=3
probe 2 "$T/ck/step-9 is a symbolic link" 1024 "$BIN" ckpt verify "$T/ck"
rm "$T/ck/step-9" && echo step-2 >"$T/ck/latest"
lines=$(wc -l <"$T/run/metrics.jsonl")
probe 0 '' 1024 "${TRAIN[@]}" --set train.steps=3
grep -q "resumed from $T/ck/step-2 at step 2" "$T/out" || fail "did not resume step-2: $(cat "$T/out")"
check "the resumed run appended to metrics.jsonl" test "$(wc -l <"$T/run/metrics.jsonl")" -eq $((lines + 1))

# ---- report --out: only a Tessera report is replaced without --force -----------------------
echo "my notes" >"$T/notes.txt"
probe 2 "report --out $T/notes.txt: it exists and is a file that is not a Tessera report; refusing to replace it" 1024 \
  "$BIN" report "$T/run" --out "$T/notes.txt"
check "notes.txt untouched" test "$(cat "$T/notes.txt")" = "my notes"
ln -s "$OUTSIDE/precious.txt" "$T/link.html"
probe 2 "report --out $T/link.html: it exists and is a symbolic link" 1024 "$BIN" report "$T/run" --out "$T/link.html"
probe 0 '' 1024 "$BIN" report "$T/run" --out "$T/link.html" --force
check "--force replaced the link itself" test -f "$T/link.html" -a ! -L "$T/link.html"
probe 0 '' 1024 "$BIN" report "$T/run" --out "$T/notes.txt" --force
probe 0 '' 1024 "$BIN" report "$T/run" --out "$T/notes.txt"  # now a report: replaced without --force
check "no temporary left beside the reports" test -z "$(ls -A "$T" | grep '\.tmp')"
echo "$pass passed, 0 failed"
