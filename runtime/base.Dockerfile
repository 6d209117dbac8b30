# Base layer: the packages every sandbox needs, extra certificate
# authorities, an unprivileged user (uid 1000, as lw-sandbox expects) and the
# entry script.
ARG LW_PARENT
FROM ${LW_PARENT}
COPY .loopwright/runtime/ca-certificates/ /usr/local/share/ca-certificates/
RUN set -eu; \
    if command -v apt-get >/dev/null; then \
        export DEBIAN_FRONTEND=noninteractive; \
        apt-get update; \
        apt-get install -y --no-install-recommends ca-certificates curl git; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    if command -v update-ca-certificates >/dev/null; then update-ca-certificates; fi; \
    if ! getent passwd 1000 >/dev/null; then useradd -m -u 1000 -s /bin/sh lw; fi; \
    mkdir -p /work && chown 1000:1000 /work
COPY .loopwright/runtime/entry.sh /usr/local/bin/lw-entry
ENTRYPOINT ["/usr/local/bin/lw-entry"]
