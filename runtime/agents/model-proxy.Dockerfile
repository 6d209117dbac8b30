# The model proxy's image: the base (egress.proxy-from) and lw-model-proxy,
# a static command (crates/model-proxy) with its TLS authorities compiled
# in, so nothing is installed.  Tagged by the hash of this recipe, the
# command's bytes and the base's id.
ARG LW_MODEL_FROM
FROM ${LW_MODEL_FROM}
COPY lw-model-proxy /usr/local/bin/lw-model-proxy
ENTRYPOINT ["/usr/local/bin/lw-model-proxy"]
