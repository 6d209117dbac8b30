#!/bin/sh
# deps.sh DIR: install the dependencies whose manifests and lockfiles DIR
# holds (the deps layer's declared inputs).  Edit it for your project: it is
# an input of the deps layer, so a change rebuilds that layer.  lw-sandbox
# may run it again inside a sandbox whose lockfiles differ from the image's
# (DIR is then /work/repo and it runs unprivileged): the same steps then
# install under /work, which the sandbox's environment looks at first.
#
#   node    npm ci / pnpm / yarn by the lockfile, into DIR/node_modules;
#           the image's is /node_modules, found by Node's own resolution
#           from /work/repo, its .bin on PATH.  pnpm and yarn are the
#           versions package.json's packageManager names, else the pins
#           below, installed next to node (so on PATH in the sandbox).
#   python  a virtual environment (/opt/loopwright/venv, or /work/.venv)
#           with the project's dependencies and its test dependencies
#           (dependency groups and optional dependencies named test, tests,
#           testing or dev, requirements*.txt, [tool.poetry]'s and PDM's
#           groups of those names; with a uv.lock, uv exports the lock's
#           pins of those same groups and extras; a poetry.lock's or
#           pdm.lock's pins constrain what pip installs), pytest when
#           nothing names it, the project's build requirements (its own
#           extension is built in the sandbox), and /work/repo/src and
#           /work/repo on its path (the project, editable from the clone).
#           A lock's package from a private index stops it (65), named.
#   rust    the lockfile's crates, vendored (/opt/loopwright/vendor, or
#           /work/.cargo/vendor) with the cargo configuration that uses them.
#   go      the modules, downloaded into a module cache the sandbox reads as
#           its proxy (GOPROXY=file://...).
set -eu
cd "$1"
LW=/opt/loopwright
if [ "$(id -u)" = 0 ]; then
    image=1
    # The sandbox's caches are under /work; the image's build keeps none.
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    export npm_config_cache="$scratch/npm" npm_config_store_dir="$scratch/pnpm" \
        UV_CACHE_DIR="$scratch/uv" GOCACHE="$scratch/go-build"
else
    image=
fi
did=
say() { echo "deps.sh: $*"; }

# The tools a lockfile needs, pinned so that the layer's inputs say what
# it installs.
PNPM=pnpm@9.15.9
YARN=yarn@1.22.22
UV=uv==0.9.30

if [ -f package.json ] && command -v npm >/dev/null; then
    pm=$(tr -d '\n' <package.json | sed -nE 's/.*"packageManager"[[:space:]]*:[[:space:]]*"([a-z]+@[0-9][^"+]*).*/\1/p')
    if [ -f pnpm-lock.yaml ]; then
        command -v pnpm >/dev/null || npm install -g --no-audit --no-fund "${pm:-$PNPM}"
        pnpm install --frozen-lockfile --ignore-scripts
    elif [ -f yarn.lock ]; then
        command -v yarn >/dev/null || npm install -g --no-audit --no-fund "${pm:-$YARN}"
        yarn install --frozen-lockfile --ignore-scripts
    elif [ -f package-lock.json ] || [ -f npm-shrinkwrap.json ]; then
        npm ci --ignore-scripts --no-audit --no-fund
    else
        say "package.json has no lockfile: npm install resolves it today"
        npm install --ignore-scripts --no-audit --no-fund --no-package-lock
    fi
    if [ -n "$image" ] && [ -d node_modules ]; then ln -sfn "$PWD/node_modules" /node_modules; fi
    did=1
fi

if { [ -f pyproject.toml ] || [ -f setup.py ] || ls requirements*.txt >/dev/null 2>&1; } && command -v python3 >/dev/null; then
    if [ -n "$image" ]; then venv=$LW/venv; else venv=/work/.venv; fi
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    req=$(mktemp -d)
    if [ -f uv.lock ]; then
        "$venv/bin/pip" install -q --no-cache-dir "$UV"
    fi
    "$venv/bin/python" - "$req" "$venv/bin/uv" <<'EOF'
import glob, os, re, subprocess, sys, tomllib
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
def toml(path):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
d = toml("pyproject.toml")
p = d.get("project", {})
reqs = list(p.get("dependencies", []))
kinds = ("test", "tests", "testing", "dev")
extras = [k for k in p.get("optional-dependencies", {}) if norm(k) in kinds]
for k in extras:
    reqs += p["optional-dependencies"][k]
groups = dict(d.get("dependency-groups", {}))
# PDM's own groups (before PEP 735) have the same shape.
for g, rs in d.get("tool", {}).get("pdm", {}).get("dev-dependencies", {}).items():
    groups.setdefault(g, rs)
def group(g, seen):
    out = []
    for r in groups.get(g, []):
        if isinstance(r, dict):
            inc = r.get("include-group")
            if inc and inc not in seen:
                out += group(inc, seen | {inc})
        elif not r.startswith("-e "):
            out.append(r)
    return out
tested = [g for g in groups if norm(g) in kinds]
for g in tested:
    reqs += group(g, {g})
# Poetry's declarations ([tool.poetry]): the names (and extras) of the main
# dependencies and of the test and dev groups; the lock says the versions.
poetry = d.get("tool", {}).get("poetry", {})
pgroups = {g: v.get("dependencies", {}) for g, v in poetry.get("group", {}).items()}
if "dev-dependencies" in poetry:
    pgroups.setdefault("dev", poetry["dev-dependencies"])
pextras = {n for k, ns in poetry.get("extras", {}).items() if norm(k) in kinds for n in ns}
ptested = [g for g in pgroups if norm(g) in kinds]
def poetry_reqs(deps):
    out = []
    for n, spec in deps.items():
        if norm(n) == "python":
            continue
        first = (spec[0] if spec else {}) if isinstance(spec, list) else spec
        if isinstance(first, dict):
            if first.get("optional") and n not in pextras:
                continue
            if "path" in first:
                print(f"deps.sh: pyproject.toml: {n} is a path dependency ({first['path']}); not installed", file=sys.stderr)
                continue
            ex = first.get("extras", [])
            out.append(n + (f"[{','.join(ex)}]" if ex else ""))
        else:
            out.append(n)
    return out
reqs += poetry_reqs(poetry.get("dependencies", {}))
for g in ptested:
    reqs += poetry_reqs(pgroups[g])
# A poetry.lock's or pdm.lock's pins hold every package installed (the
# project's and theirs) to the lock's version.  A package the lock takes
# from another index than PyPI stops the build here, named, with the fix:
# the image build reaches PyPI (and PIP_INDEX_URL/PIP_EXTRA_INDEX_URL when
# deps.sh sets them), not the project's private index.
reach = [u.rstrip("/") for u in (os.environ.get("PIP_INDEX_URL", "") + " " + os.environ.get("PIP_EXTRA_INDEX_URL", "")).split()]
installed = {"main", "default"} | {norm(g) for g in ptested + tested}
urls, seen = {}, {}
for lock in ("poetry.lock", "pdm.lock"):
    for pkg in toml(lock).get("package", []):
        n, v = norm(pkg["name"]), pkg["version"]
        gs = pkg.get("groups") or ([pkg["category"]] if "category" in pkg else None)
        if gs is not None and not {norm(g) for g in gs} & installed:
            continue
        src = pkg.get("source", {})
        kind = src.get("type")
        if kind == "git" or "git" in pkg:
            url = src.get("url") or pkg["git"]
            rev = src.get("resolved_reference") or pkg.get("revision") or src.get("reference", "")
            urls[n] = f"{pkg['name']} @ git+{url}" + (f"@{rev}" if rev else "")
        elif kind == "url":
            urls[n] = f"{pkg['name']} @ {src['url']}"
        elif kind in ("directory", "file"):
            print(f"deps.sh: {lock}: {pkg['name']} comes from {kind} {src.get('url')}; not installed", file=sys.stderr)
        elif kind and kind != "pypi" and src.get("url", "").rstrip("/") not in reach:
            print(f"deps.sh: {lock}: {pkg['name']} {v} comes from the package source "
                  f"'{src.get('reference', kind)}' ({src.get('url')}), which the image build does not "
                  f"reach: it installs from PyPI.  To fix, where that index is reachable without "
                  f"credentials, add 'export PIP_EXTRA_INDEX_URL={src.get('url')}' to "
                  f".loopwright/runtime/deps.sh (an input of the deps layer); else take "
                  f"{pkg['name']} from PyPI", file=sys.stderr)
            sys.exit(65)
        else:
            m = pkg.get("markers", pkg.get("marker"))
            if isinstance(m, dict):
                # Poetry's per group: what the installed groups' say.
                ms = [m.get(g) for g in (gs or []) if norm(g) in installed]
                m = None if not ms or None in ms else " or ".join(f"({x})" for x in ms)
            seen.setdefault(n, []).append((v, m))
# A lock may hold a package at two versions, each for its Pythons (its
# markers): the one whose markers hold here, with the extras installed.
def holds(m):
    if not m:
        return True
    try:
        from pip._vendor.packaging.markers import Marker
        return any(Marker(m).evaluate({"extra": e}) for e in extras + [""])
    except Exception:
        return True
pins = []
for n, vs in sorted(seen.items()):
    here = {v for v, _ in vs}
    if len(here) > 1:
        here = {v for v, m in vs if holds(m)}
    if len(here) == 1:
        pins.append(f"{n}=={here.pop()}")
    elif here:
        print(f"deps.sh: {n}: the lock's {', '.join(sorted(here))} all fit here; pip picks", file=sys.stderr)
# The lock's pins of the same groups and extras (not its docs or lint).
if os.path.exists("uv.lock"):
    cmd = [sys.argv[2], "export", "--frozen", "--no-hashes", "--no-emit-project",
           "--no-default-groups", "-o", sys.argv[1] + "/uv.txt"]
    cmd += [a for g in tested for a in ("--group", g)]
    cmd += [a for k in extras for a in ("--extra", k)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
for f in sorted(glob.glob("requirements*.txt")):
    for line in open(f):
        line = line.split(" #")[0].strip()
        # The project itself comes from the clone, not from here.
        if not line or line.startswith("#") or re.match(r"^(-e|--editable)?\s*\.(\[.*\])?$", line):
            continue
        if line.startswith(("-r", "-c", "--requirement", "--constraint")):
            continue
        reqs.append(line)
# What the project's own build needs (setuptools for a setup.py), so that
# building its extension in the sandbox works offline
# (python3 setup.py build_ext --inplace, pip install --no-build-isolation).
bs = d.get("build-system", {})
if "requires" in bs:
    reqs += bs["requires"]
elif os.path.exists("setup.py"):
    reqs.append("setuptools")
name = norm(p.get("name", "") or poetry.get("name", ""))
key = lambda r: norm(re.split(r"[\s\[<>=!~;@(]", r, maxsplit=1)[0])
out = [urls.get(key(r), r) for r in reqs if key(r) != name]
if not any(key(r) == "pytest" for r in out):
    print("deps.sh: nothing names pytest; adding it", file=sys.stderr)
    out.append("pytest")
open(sys.argv[1] + "/project.txt", "w").write("\n".join(out) + "\n")
if pins:
    open(sys.argv[1] + "/lock.pins", "w").write("\n".join(pins) + "\n")
EOF
    # One resolution: the lock's pins hold the declarations to its versions.
    set --
    for f in "$req"/*.txt; do set -- "$@" -r "$f"; done
    [ ! -f "$req/lock.pins" ] || set -- "$@" -c "$req/lock.pins"
    "$venv/bin/pip" install --no-cache-dir --disable-pip-version-check "$@" || {
        st=$?
        say "python: pip install failed (exit $st); pip's error above names the package and the step.  A package built from source (no wheel for this Python) needs the C compiler toolchain.sh installs and its library's headers (Debian's -dev package, added to toolchain.sh)"
        exit 65
    }
    rm -rf "$req"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '/work/repo/src\n/work/repo\n' >"$site/loopwright-repo.pth"
    did=1
fi

if [ -f Cargo.toml ] && command -v cargo >/dev/null; then
    # cargo reads every member's manifest and wants each target's file: a
    # copy of the manifests with empty stand-ins for the sources.
    work=$(mktemp -d)
    cp -a . "$work/ws"
    find "$work/ws" -name Cargo.toml | while read -r m; do
        d=$(dirname "$m")
        [ -f "$d/src/lib.rs" ] || [ -f "$d/src/main.rs" ] || { mkdir -p "$d/src"; : >"$d/src/lib.rs"; }
        awk -v d="$d" '
            /^\[\[bench\]\]/ { k = "benches"; next } /^\[\[test\]\]/ { k = "tests"; next }
            /^\[\[example\]\]/ { k = "examples"; next } /^\[\[bin\]\]/ { k = "src/bin"; next }
            /^\[/ { k = "" }
            /^[ \t]*(path|build)[ \t]*=[ \t]*"[^"]*\.rs"/ { split($0, a, "\""); print d "/" a[2] }
            k != "" && /^[ \t]*name[ \t]*=/ { split($0, a, "\""); print d "/" k "/" a[2] ".rs" }
        ' "$m" | while read -r f; do mkdir -p "$(dirname "$f")"; [ -e "$f" ] || : >"$f"; done
    done
    if [ -n "$image" ]; then
        vendor=$LW/vendor; config=/.cargo/config.toml; export CARGO_HOME=$work/home
    else
        vendor=/work/.cargo/vendor; config=/work/.cargo/config.toml
    fi
    mkdir -p "$(dirname "$config")"
    (cd "$work/ws" && cargo vendor --locked --versioned-dirs "$vendor") >"$config.new"
    mv "$config.new" "$config"
    rm -rf "$work"
    chmod -R a+rX "$vendor" "$config"
    did=1
fi

if [ -f go.mod ] && command -v go >/dev/null; then
    if [ -n "$image" ]; then
        # A module with no dependency still gets its (empty) proxy.
        mkdir -p "$LW/gomod/cache/download"
        GOMODCACHE=$LW/gomod GOPROXY=https://proxy.golang.org,direct GOSUMDB=sum.golang.org GOFLAGS=-modcacherw go mod download
        chmod -R a+rX "$LW/gomod"
    else
        go mod download
    fi
    did=1
fi
[ -n "$did" ] || say "no dependency installed (no lockfile with a matching tool)"
