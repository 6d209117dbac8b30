# A kit's `prepare` line, after the install: this text follows
# cli.Dockerfile's only for a kit that has one, so the other kits' recipes,
# tags and images are what they were.  The line runs once, by sh in
# /opt/lw-agent/KIT, as root, with the kit's program and node first on PATH
# and a throw-away HOME (no XDG_* directories): what the CLI would unpack
# or cache in HOME the first time it runs is made here, once, in the shared
# CLI image, and not again in each project's agent image and each sandbox.
# Nothing under /opt/lw-agent stays writable but by root: a sandbox runs
# what is there.
ARG LW_AGENT_PREPARE
RUN set -eu; \
    d=/opt/lw-agent/$LW_AGENT_KIT; h=$(mktemp -d); cd "$d"; \
    (unset XDG_CACHE_HOME XDG_CONFIG_HOME XDG_DATA_HOME XDG_STATE_HOME; \
     export HOME="$h" PATH="$d/bin:$d/node/bin:$PATH"; \
     sh -eu -c "$LW_AGENT_PREPARE"; \
     "$LW_AGENT_PROGRAM" --version); \
    rm -rf "$h"; \
    chmod -R a+rX,go-w /opt/lw-agent
