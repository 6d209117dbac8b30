# The model proxy's image: python3 from Debian's packages and the proxy
# script.  Tagged by the hash of this recipe and its base (egress.proxy-from).
ARG LW_MODEL_FROM
FROM ${LW_MODEL_FROM}
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; apt-get install -y --no-install-recommends python3 ca-certificates; \
    rm -rf /var/lib/apt/lists/*
COPY model-proxy.py /usr/local/bin/lw-model-proxy
ENTRYPOINT ["python3", "-u", "/usr/local/bin/lw-model-proxy"]
