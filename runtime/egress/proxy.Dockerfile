# The egress proxy: squid from Debian's packages, run unprivileged.
#
# One proxy container runs per sandbox that asks for `--network egress`.  It
# is the only thing on the sandbox's internal network with a second network
# that leads out.  Its whole configuration (the allow-list rendered into
# squid ACLs) arrives in LW_EGRESS_CONF when the container is created, so
# this image is the same for every sandbox and every allow-list, and is
# tagged by the hash of this file, entry.sh and the base image's id.
ARG LW_EGRESS_FROM
FROM ${LW_EGRESS_FROM}
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends squid; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /etc/squid/squid.conf; \
    squid -v | head -1
COPY entry.sh /usr/local/bin/lw-egress-entry
USER proxy
EXPOSE 3128
ENTRYPOINT ["/usr/local/bin/lw-egress-entry"]
