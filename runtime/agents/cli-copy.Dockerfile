# The CLI image proper: /opt/lw-agent of the install step (cli.Dockerfile)
# and nothing else, one layer on an empty image.  agent.Dockerfile copies
# this image's root onto a project's image, which reproduces this layer
# byte for byte (same files, same times), so every project's agent image
# holds the same layer: one diff ID, one blob in a registry or a `docker
# save` of several projects.
ARG LW_BUILD
FROM ${LW_BUILD} AS build
FROM scratch
COPY --from=build /opt/lw-agent/ /opt/lw-agent/
