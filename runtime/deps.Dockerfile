# Deps layer: the project's dependencies, installed from its lockfiles.  The
# build context holds exactly this layer's declared inputs, at their project
# paths, so the COPY below brings in the lockfiles and nothing else.
ARG LW_PARENT
FROM ${LW_PARENT}
COPY . /opt/loopwright/deps/
RUN sh /opt/loopwright/deps/.loopwright/runtime/deps.sh /opt/loopwright/deps
