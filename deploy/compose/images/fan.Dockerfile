# fan's services, fanctl and fan-nats (the real nats-server embedded in a
# small entry point), as static binaries in an empty image: nothing is
# pulled, so the lab builds on a machine without registry access.
# Build context: a directory holding the binaries (see build-images.sh).
FROM scratch
COPY fan-prober fan-arbiter fan-ipmover fan-replicator fan-scheduler fan-nats fanctl /usr/local/bin/
ENV PATH=/usr/local/bin
LABEL org.opencontainers.image.title="fan" \
      org.opencontainers.image.description="fan services for the compose lab (FROM scratch, static binaries)"
