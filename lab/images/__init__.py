"""The lab's container images: a debootstrap rootfs, the vLLM stand-in, the lobes gateway.

Entry point: `lab.images.build.build_and_push` (see that module). Nothing here pulls from a
registry; everything is built locally and pushed to the lab's own registry.
"""
