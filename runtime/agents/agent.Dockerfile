# An agent kit above the project's image: the CLI image (cli-copy.Dockerfile,
# one layer holding /opt/lw-agent) copied onto the deps layer.  Copying its
# root, not /opt/lw-agent, keeps the times of /opt and /opt/lw-agent, so the
# layer is the CLI image's own, the same diff ID in every project.  Only
# this copy reruns when the project's dependencies change; only the CLI
# image and this copy when the kit does.
# The program is linked into /usr/local/bin (PATH is left alone: an
# imported base image may not set it); the kit's node is linked there too,
# for launchers, only when the image has no node of its own.
ARG LW_AGENT_CLI
ARG LW_PARENT
FROM ${LW_AGENT_CLI} AS cli
FROM ${LW_PARENT}
ARG LW_AGENT_KIT
COPY --from=cli / /
ARG LW_AGENT_PROGRAM
USER 0
RUN set -eu; d=/opt/lw-agent/$LW_AGENT_KIT; \
    ln -sf "$d/bin/$LW_AGENT_PROGRAM" "/usr/local/bin/$LW_AGENT_PROGRAM"; \
    command -v node >/dev/null || ln -s "$d/node/bin/node" /usr/local/bin/node; \
    "$LW_AGENT_PROGRAM" --version
