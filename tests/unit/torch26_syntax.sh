#!/usr/bin/env bash
# LibTorch 2.6 API check (issue 34, "One source, LibTorch 1.13 and 2.x"). CI builds against Debian 12's
# LibTorch 1.13; GPU users have 2.x. Here every Tessera source (runtime/, text/, launcher/, model/,
# benchmarks/, util/, tools/, app/ and tests/ .cpp files) is compiled syntax-only (gcc -fsyntax-only, the build's
# flags, TESSERA_WITH_CUDA=1 with the CUDA and NCCL headers of /usr/local/cuda) against Debian 13's
# LibTorch 2.6 headers, which scripts/torch26_headers.sh fetches (never installs) into $TORCH26_DIR.
# A LibTorch 2.x API break fails here, naming the file and gcc's error. And the check can fail:
# tests/unit/fixtures/tracker_pre_compat.cpp (tracker.cpp before util/torch_compat.h) must fail the
# same compile, for the 2.3 allocator API (allocate() "marked 'override', but does not override",
# an abstract class: allocate and copy_data pure).
#
# Nothing here passes without having checked: a failed fetch, missing CUDA headers, a header taken
# from the host's LibTorch 1.13 instead of 2.6 (every compile's dependency list is read), or a source
# not covered, each fails the test.
#
# Fast (CI time): cmake/pch.h (torch/torch.h, ...) is precompiled once per header set and gcc
# ($TORCH26_DIR/pch-*, reused while nothing changes), and the sources are checked in a few unity
# translation units (each .cpp #included in turn: gcc's fixed cost per translation unit with a
# LibTorch precompiled header is ~6 CPU-s, so there are as many units as jobs). Files go into one unit only when the names they define at
# file scope differ (functions, types, TEST()s, macros, with their namespaces and using-directives); a
# unit that still fails has the files its errors point at re-checked alone and the rest re-checked as
# one unit, and only a file that fails alone fails the test. Parallel: $TORCH26_JOBS (default: the
# processors online, at most 8; not nproc's answer, which the suite's OMP_NUM_THREADS=1 makes 1). The fixture compiles beside the units,
# with the same precompiled header.
#
# Environment (cmake/torch26_check.cmake sets the first two for ctest): TORCH26_DIR (default
# build/torch26), TORCH26_FLAGS (a file, one compiler argument per line: the include directories and
# definitions of the build, LibTorch's excluded; default: derived here), CUDA_HOME (/usr/local/cuda),
# TORCH26_CUDA=0 (check without the CUDA path, where no CUDA headers exist).
set -euo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
DIR=${TORCH26_DIR:-${TESSERA_BIN:+$TESSERA_BIN/../torch26}}
DIR=${DIR:-$SRC/build/torch26}
CUDA=${CUDA_HOME:-/usr/local/cuda}
JOBS=${TORCH26_JOBS:-$(n=$(getconf _NPROCESSORS_ONLN); echo $((n > 8 ? 8 : n)))}
CXX=${TORCH26_CXX:-g++}
export LC_ALL=C  # gcc's messages with plain quotes
source "$SRC/tests/expect.bash"  # ok, fail, check
t_start=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# --- the LibTorch 2.6 headers -----------------------------------------------------------------------
bash "$SRC/scripts/torch26_headers.sh" "$DIR" ||
  fail "could not fetch Debian 13's LibTorch 2.6 headers (scripts/torch26_headers.sh $DIR): the check did not run"
DIR=$(cd "$DIR" && pwd)
INC=$DIR/root/usr/include
ok "headers: $(cat "$DIR/stamp"), fetched in $(since "$t_start") s"

# --- flags -------------------------------------------------------------------------------------------
# LibTorch 2.6's own compile definitions and flags (its Caffe2Targets.cmake / TorchConfig.cmake).
FLAGS=(-std=gnu++17 -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DUSE_C10D_MPI -DUSE_RPC
       -DUSE_TENSORPIPE -I"$SRC" -isystem "$DIR/gen" -isystem "$INC" -isystem "$INC/torch/csrc/api/include")
if [ "${TORCH26_CUDA:-1}" != 0 ]; then
  FLAGS+=(-DTESSERA_WITH_CUDA=1 -isystem "$CUDA/include")
fi
if [ -n "${TORCH26_FLAGS:-}" ]; then
  [ -s "$TORCH26_FLAGS" ] || fail "TORCH26_FLAGS=$TORCH26_FLAGS is missing or empty (reconfigure the build)"
  mapfile -t extra < <(grep -v '^$' "$TORCH26_FLAGS")
else  # what the build passes on Debian 12, without CMake
  extra=(-DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 $(mpicc --showme:incdirs | sed 's/\(^\| \)/ -isystem /g'))
fi
FLAGS+=("${extra[@]}" -Wall -Wno-unused-parameter -Wno-sign-compare)
if [ "${TORCH26_CUDA:-1}" != 0 ]; then
  printf '#include <cuda_runtime_api.h>\n#include <nccl.h>\n' | "$CXX" "${FLAGS[@]}" -E -x c++ - > /dev/null 2>&1 ||
    fail "no CUDA runtime or NCCL headers (looked in $CUDA/include: set CUDA_HOME, or TORCH26_CUDA=0 to check without the CUDA path)"
fi

# --- the sources ------------------------------------------------------------------------------------------
cd "$SRC"
mapfile -t SOURCES < <(find runtime text tools launcher model benchmarks util app tests -name '*.cpp' -not -path 'tests/unit/fixtures/*' \
                         -not -path 'tests/tokenizer/node_modules/*' | sort)
check "${#SOURCES[@]} sources to check (runtime, text, tools, launcher, model, benchmarks, util, app, tests)" test "${#SOURCES[@]}" -ge 100
FIXTURE=tests/unit/fixtures/tracker_pre_compat.cpp
check "the fixture exists" test -f "$FIXTURE"

# --- precompiled header (cached per compiler, flags, header set and cmake/pch.h) ---------------------------
key=$({ "$CXX" --version | head -1; printf '%s\n' "${FLAGS[@]}"; cat "$DIR/stamp" cmake/pch.h; } | sha256sum | cut -c1-16)
P=$DIR/pch-$key
t0=$(date +%s.%N)
if [ -f "$P/pch.h.gch" ]; then
  ok "precompiled header reused ($P)"
else
  find "$DIR" -maxdepth 1 -name 'pch-*' -type d -exec rm -rf {} +  # an old one is ~650 MB
  mkdir -p "$P.tmp"
  grep -v '^#pragma once' cmake/pch.h > "$P.tmp/pch.h"
  "$CXX" "${FLAGS[@]}" -x c++-header "$P.tmp/pch.h" -o "$P.tmp/pch.h.gch" -MD -MF "$P.tmp/pch.d" > "$P.tmp/log" 2>&1 ||
    { cat "$P.tmp/log"; fail "precompiling cmake/pch.h against LibTorch 2.6 failed"; }
  mv "$P.tmp" "$P"
  ok "cmake/pch.h precompiled against LibTorch 2.6 in $(since "$t0") s"
fi
# The fixture: the same compile, beside the units (with the precompiled header: 6 CPU-s, against 17
# without it).
mkdir -p "$DIR/fixture"
( rc=0; "$CXX" "${FLAGS[@]}" -include "$P/pch.h" -Winvalid-pch -fsyntax-only "$FIXTURE" > "$DIR/fixture/log" 2>&1 || rc=$?
  echo $rc > "$DIR/fixture/rc" ) &
fixture_pid=$!

# --- the sources, in unity units -------------------------------------------------------------------------
W=$DIR/work
rm -rf "$W"; mkdir -p "$W"
t0=$(date +%s.%N)
printf '%s\n' "${FLAGS[@]}" > "$W/flags"
printf '%s\n' "${SOURCES[@]}" > "$W/sources"
rc=0
python3 - "$W" "$P/pch.h" "$JOBS" "$CXX" <<'PY' || rc=$?
import concurrent.futures as cf, os, re, subprocess, sys, time
W, pch, jobs, cxx = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
flags = open(W + "/flags").read().split("\n")[:-1]
sources = open(W + "/sources").read().split()

# Names each file defines at namespace scope (the code is not indented inside namespaces), with their
# namespace, and those of the project headers it includes. Two files collide in a unity unit when one
# defines in an anonymous namespace (or static) a name that the other defines or declares in the same
# enclosing namespace (gtest TEST()s count as such), when both define the same function or type
# outside an anonymous namespace (a header's declaration and its .cpp's definition are one entity),
# or when an alias or macro of the same name differs.
DEF = [re.compile(p) for p in (
    r"^(?:TEST|TEST_F|TEST_P)\(\s*(\w+\s*,\s*\w+)",
    r"^(?:#define|namespace|using)\s+(\w+)(?:\s*=|\(|\s|$)",
    r"^(?:struct|class|union|enum(?:\s+class)?)\s+(\w+)(?:\s+final)?\s*(?:[:{]|$)",
    r"^[A-Za-z_\"][\w:<>,\s\*&\"]*?[\s\*&]\**&*(~?[A-Za-z_]\w*)\s*\(",
    r"^(?:static\s+|inline\s+|const\s+|constexpr\s+)*[A-Za-z_][\w:<>,\s\*&]*?\s\**(\w+)\s*(?:\[[^\]]*\])?\s*(?:=|\{)",
)]
SKIP = ("//", "}", "{", ")", "#include", "#if", "#endif", "#else", "#pragma", "#undef", "using namespace", "template")
ENTRIES = {"main", "LLVMFuzzerTestOneInput"}  # a program's entry point: every harness defines one
KEYWORDS = {"if", "for", "while", "switch", "return", "else", "do", "sizeof", "case"}
INCLUDE = re.compile(r'^#include\s+"([^"]+)"')
OPEN_NS = re.compile(r"^(?:inline\s+)?namespace\s*([\w:]*)\s*\{")
CLOSE_NS = re.compile(r"^\}\s*//\s*namespace")
USING = re.compile(r"^using\s+namespace\s+([\w:]+)\s*;")
def scan(path, header):  # {(namespace, name): kind}, included project headers, using-directives
    out, incs, stack, dirs = {}, [], [], set()
    for line in open(path, errors="replace"):
        m = INCLUDE.match(line)
        if m:
            for base in (os.path.dirname(path), "."):
                cand = os.path.normpath(os.path.join(base, m.group(1)))
                if os.path.isfile(cand):
                    incs.append(cand)
                    break
            continue
        m = OPEN_NS.match(line)
        if m:
            stack.append(m.group(1) or None)
            continue
        if CLOSE_NS.match(line):
            stack = stack[:-1]
            continue
        m = USING.match(line)
        if m:
            dirs.add(("::".join(x for x in stack if x), m.group(1)))
            continue
        if not line[:1].strip() or line.startswith(SKIP):
            continue
        for i, rx in enumerate(DEF):
            m = rx.match(line)
            if m:
                name = m.group(1)
                if name in KEYWORDS:
                    break
                ns = "::".join(x for x in stack if x)
                if i == 1:
                    kind = ("text", line.strip())  # alias or macro
                    ns = "" if line.startswith("#") else ns
                elif header:
                    kind = ("header", path)
                elif i == 0 or None in stack or line.startswith("static "):
                    kind = ("internal",)  # anonymous namespace, static, TEST()
                elif name in ENTRIES:
                    kind = ("entry",)  # renamed per file in a unit (compile_), so never a clash
                else:
                    kind = ("external",)
                out[(ns, name)] = kind
                break
    return out, incs, dirs
header_cache = {}
def names(path):  # -> ({(namespace, name): kind}, using-directives), the headers' included
    out, incs, dirs = scan(path, False)
    seen = set()
    while incs:
        h = incs.pop()
        if h in seen:
            continue
        seen.add(h)
        if h not in header_cache:
            header_cache[h] = scan(h, True)
        hn, hi, hd = header_cache[h]
        dirs |= hd
        for k, v in hn.items():  # a .cpp's external definition of what its header declares: one entity
            if out.get(k, ("external",)) == ("external",):
                out[k] = v
        incs += hi
    return out, dirs
def clash(x, y):
    if x[0] == "internal" or y[0] == "internal":
        return True
    if x[0] == "text" or y[0] == "text":
        return x != y
    return x[0] == "external" and y[0] == "external"
# A using-directive at file scope stays in force for the files after it in a unit: the names of the
# namespace it names then meet the global names of those files.
index = {}  # namespace -> every name declared or defined in it, by any source or header
def build_index(all_names):
    for d in all_names:
        for (ns, n) in d:
            index.setdefault(ns, set()).add(n)
def resolve(dns, x):
    parts = dns.split("::") if dns else []
    for i in range(len(parts), -1, -1):
        cand = "::".join(parts[:i] + [x])
        if cand in index:
            return cand
    return x
def opened(dirs):  # names that a file's using-directives bring into the global namespace
    return set().union(*[index.get(resolve(dns, x), set()) for dns, x in dirs if dns == ""])
def collide(a, b):
    (an, ad), (bn, bd) = a, b
    if any(k in an and clash(an[k], v) for k, v in bn.items()):
        return True
    for names_, dirs in ((an, bd), (bn, ad)):
        glob = {n for (ns, n), v in names_.items() if ns == "" and v[0] in ("internal", "external")}
        if glob & opened(dirs):
            return True
    return False

# Greedy: the largest files first, each into the lightest unit it does not collide with.
named = {f: names(f) for f in sources}
build_index([n for n, _ in named.values()] + [h[0] for h in header_cache.values()])
nunits = max(2, jobs)  # each unit loads the 650 MB precompiled header: ~6 CPU-s
units = [{"files": [], "names": ({}, set()), "size": 0} for _ in range(nunits)]
for f in sorted(sources, key=lambda f: -os.path.getsize(f)):
    fits = [u for u in units if not collide(u["names"], named[f])]
    if not fits:
        units.append({"files": [], "names": ({}, set()), "size": 0}); fits = [units[-1]]
    u = min([u for u in fits if units.index(u) < nunits] or fits, key=lambda u: u["size"])  # extra units: only collisions
    u["files"].append(f); u["size"] += os.path.getsize(f) + 20000
    u["names"][0].update(named[f][0]); u["names"][1].update(named[f][1])
units = [u for u in units if u["files"]]

def compile_(tag, files):
    tu = f"{W}/{tag}.cpp"
    with open(tu, "w") as o:
        for k, f in enumerate(files):
            entries = sorted({n for (ns, n), v in named.get(f, ({}, 0))[0].items() if v == ("entry",)})
            o.write("".join(f"#define {n} {n}_{k}\n" for n in entries))
            o.write(f'#include "{os.path.abspath(f)}"\n')
            o.write("".join(f"#undef {n}\n" for n in entries))
    t = time.time()
    p = subprocess.run([cxx, *flags, "-include", pch, "-Winvalid-pch", "-fsyntax-only", "-MD", "-MF", f"{W}/{tag}.d",
                        "-MT", tag, tu], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    open(f"{W}/{tag}.log", "w").write(p.stdout)
    return tag, files, p.returncode, p.stdout, time.time() - t

def run(batch):
    with cf.ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(lambda a: compile_(*a), batch))

# A unit that fails: the files its errors point at (the error's own file, or for an error in a header
# the unit's #include line it came through) are re-checked alone, the rest again as one unit (a fatal
# error stops a unit, so what followed it is checked too). Only a file that fails alone fails the test.
ERROR = re.compile(r"^(/[^:]+):\d+(?::\d+)?: (?:fatal )?error:")
def blamed(tag, files, out):
    tu, k, hit = f"{W}/{tag}.cpp", None, []
    for line in out.splitlines():
        m = re.search(re.escape(tu) + r":(\d+)", line)
        if m:
            k = int(m.group(1))
        m = ERROR.match(line)
        if m:
            path = m.group(1)
            f = next((f for f in files if os.path.abspath(f) == path), None)
            if f is None and k and 1 <= k <= len(files):
                f = files[k - 1]
            if f and f not in hit:
                hit.append(f)
    return hit

t0 = time.time()
pending, done, bad, failed_units, n_alone = [(f"unit{i}", u["files"]) for i, u in enumerate(units)], [], [], [], 0
while pending:
    results = run(pending)
    done += results
    pending = []
    for tag, files, rc, out, dt in results:
        if len(files) > 1 or tag.startswith("unit"):
            print(f"  {tag}: {len(files)} files, {dt:.1f} s, {'ok' if rc == 0 else 'FAILED'}")
        if rc == 0:
            continue
        if len(files) == 1:
            bad.append((tag, files, rc, out, dt))
            continue
        failed_units.append(tag)
        hit = blamed(tag, files, out) or files
        print(f"    re-checked alone: {', '.join(hit)}")
        pending += [(f"{tag}_{i}_{os.path.basename(f)[:-4]}", [f]) for i, f in enumerate(hit)]
        n_alone += len(hit)
        rest = [f for f in files if f not in hit]
        if rest:
            pending.append((f"{tag}r", rest))
if failed_units and not bad:
    print(f"  warning: {', '.join(failed_units)} failed but no file fails alone (a unity collision the name heuristic missed: slower, not wrong)")
for tag, files, rc, out, dt in bad:
    errs = [l for l in out.splitlines() if ": error:" in l or "fatal error" in l]
    print(f"  {files[0]}: {len(errs)} error(s) against LibTorch 2.6:")
    for l in errs[:12]:
        print("    " + l)
# No header may come from another LibTorch (the host's 1.13 in /usr/include) than the fetched one.
root = os.path.dirname(os.path.dirname(pch)) + "/"
leaks = set()
for d in [os.path.dirname(pch) + "/pch.d"] + [f"{W}/{r[0]}.d" for r in done]:
    try:
        deps = open(d).read().replace("\\\n", " ").split()
    except FileNotFoundError:
        continue
    leaks |= {d for d in deps if re.search(r"/(ATen|c10|caffe2|torch)/", d) and not d.startswith(root)}
for d in sorted(leaks)[:10]:
    print(f"  header not from LibTorch 2.6: {d}")
invalid = [r[0] for r in done if "not using" in r[3] or "invalid-pch" in r[3]]
for tag in invalid[:3]:
    print(f"  {tag}: the precompiled header was not used:\n" + open(f"{W}/{tag}.log").read()[:2000])
print(f"  {len(sources)} files in {len(units)} units, {n_alone} re-checked alone, {time.time() - t0:.1f} s")
sys.exit(1 if bad or leaks else (3 if invalid else 0))
PY
case $rc in
  0) ok "every source compiles against LibTorch 2.6 (${#SOURCES[@]} files, $(since "$t0") s)" ;;
  3) fail "the precompiled header was not used (see above)" ;;
  *) fail "sources do not compile against LibTorch 2.6, or took headers from elsewhere (see above; logs in $W)" ;;
esac

# --- the fixture must fail, for the 2.3 allocator API ------------------------------------------------------
wait $fixture_pid
F=$DIR/fixture/log
check "the pre-compat tracker.cpp fails the same compile (rc $(cat "$DIR/fixture/rc"))" test "$(cat "$DIR/fixture/rc")" -ne 0
has() { grep -qF -- "$1" "$F"; }
has "marked 'override'" && has "abstract type" || { echo "the fixture's compile said:"; head -40 "$F"; }
check "... because allocate() const overrides nothing (LibTorch 2.3's allocate is non-const)" \
  has "TrackingAllocator::allocate(size_t) const' marked 'override', but does not override"
check "... and TrackingAllocator is abstract" has "to be of abstract type 'tessera::memory::{anonymous}::TrackingAllocator'"
check "... with allocate(size_t) pure" has "'virtual c10::DataPtr c10::Allocator::allocate(size_t)'"
check "... and copy_data() const pure" has "'virtual void c10::Allocator::copy_data(void*, const void*, std::size_t) const'"
echo "$pass passed, 0 failed ($(since "$t_start") s)"
