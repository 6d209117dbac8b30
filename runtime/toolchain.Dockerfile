# Toolchain layer: mise at the pinned version (LW_MISE_VERSION, from the
# 'provider' line), installing the tools mise.toml declares.  The layer's tag
# covers that version and mise.toml, so 'mise install' reruns exactly when
# either changes.  mise comes from the npm registry's @jdxcode/mise-linux-x64
# package, which ships the release binary.
ARG LW_PARENT
FROM ${LW_PARENT}
ARG LW_MISE_VERSION
ENV MISE_DATA_DIR=/opt/mise \
    MISE_CACHE_DIR=/opt/mise/cache \
    MISE_YES=1 \
    MISE_NPM_PACKAGE_MANAGER=npm \
    PATH=/opt/mise/shims:$PATH
COPY .loopwright/runtime/mise.toml /etc/mise/config.toml
# Backends that run another package manager need it first.
RUN set -eu; pkgs=; \
    if grep -Eq '^[^#]*pipx:' /etc/mise/config.toml; then pkgs="$pkgs pipx"; fi; \
    if grep -Eq '^[^#]*npm:' /etc/mise/config.toml; then pkgs="$pkgs nodejs npm"; fi; \
    if [ -n "$pkgs" ]; then \
        export DEBIAN_FRONTEND=noninteractive; \
        apt-get update; apt-get install -y --no-install-recommends $pkgs; \
        rm -rf /var/lib/apt/lists/*; \
    fi
RUN set -eu; \
    curl -fsSL "https://registry.npmjs.org/@jdxcode/mise-linux-x64/-/mise-linux-x64-${LW_MISE_VERSION}.tgz" \
        | tar -xzf - -C /tmp package/bin/mise; \
    install -m 755 /tmp/package/bin/mise /usr/local/bin/mise; rm -rf /tmp/package; \
    mise --version; \
    mise install; \
    mise reshim; \
    chmod -R a+rX /opt/mise
