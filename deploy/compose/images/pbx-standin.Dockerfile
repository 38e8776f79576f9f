# The lab's STAND-IN for an Asterisk node: the AMI peer plus a SIP responder
# answering OPTIONS and REGISTER (lab/pbxstandin). It is not a PBX. Set
# FAN_PBX_IMAGE to use a real Asterisk image instead (README.md).
FROM scratch
COPY fan-pbxstandin /usr/local/bin/
ENV PATH=/usr/local/bin
ENTRYPOINT ["/usr/local/bin/fan-pbxstandin"]
LABEL org.opencontainers.image.title="fan-pbxstandin" \
      org.opencontainers.image.description="LAB STAND-IN for Asterisk (AMI peer + SIP OPTIONS/REGISTER responder), not a PBX"
