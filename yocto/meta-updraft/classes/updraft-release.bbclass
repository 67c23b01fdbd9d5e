# updraft-release: an image recipe's root filesystem image as a signed
# updraft release.
#
# Inherited by an image recipe (or globally with IMAGE_CLASSES), it
#  * writes the release marker /etc/updraft/release into the root
#    filesystem (UPDRAFT_RELEASE="${UPDRAFT_RELEASE_VERSION}"), so that a
#    freshly flashed device knows the release it runs;
#  * adds UPDRAFT_RELEASE_FSTYPE (ext4 by default) to IMAGE_FSTYPES and,
#    after the image is complete, signs that image with updraft-publish
#    (built natively) into a release directory and a single-file bundle in
#    DEPLOY_DIR_IMAGE, with a delta from each image UPDRAFT_PREVIOUS_IMAGE
#    names.
#
# Both steps are the commands of scripts/updraft-release-image in this
# layer; the class only supplies their arguments, so the commands tested
# outside bitbake are the ones the build runs.
#
# The signing key (UPDRAFT_SIGNING_KEY) is a path outside the build tree,
# read where it lies by the publisher and never copied into TMPDIR, the
# deploy directory or sstate. It is kept out of every task signature, and
# do_updraft_release runs on every build (it signs, with an expiry, and
# its output is not shared through sstate). See README.md.

# The release version, signed into the manifest and written into the marker.
UPDRAFT_RELEASE_VERSION ??= "${DISTRO_VERSION}"
# Hardware ids the release is for: the devices' device.compatible.
UPDRAFT_COMPATIBLE ??= "${MACHINE}"
# The image type that is the slot image.
UPDRAFT_RELEASE_FSTYPE ??= "ext4"
# The release key, a path outside TOPDIR (see README.md). Empty: the image
# is built and marked, and do_updraft_release fails saying what is missing.
UPDRAFT_SIGNING_KEY ??= ""
# A directory of key documents (N.json, made offline with the root key by
# `updraft-publish keys`), copied into the release; empty in simple mode.
UPDRAFT_KEY_DOCUMENTS ??= ""
# Earlier images (space-separated paths) to publish deltas from.
UPDRAFT_PREVIOUS_IMAGE ??= ""
# The channel signed into the manifest; empty: updraft-publish's default.
UPDRAFT_RELEASE_CHANNEL ??= ""
# The manifest serial; empty: one above the release directory's last.
UPDRAFT_RELEASE_SERIAL ??= ""
# More arguments for `updraft-publish release` (--expires, --level, ...).
UPDRAFT_PUBLISH_ARGS ??= ""
# Where the release directory and the bundle go.
UPDRAFT_RELEASE_DIR ??= "${DEPLOY_DIR_IMAGE}/updraft-${IMAGE_LINK_NAME}"
UPDRAFT_BUNDLE ??= "${DEPLOY_DIR_IMAGE}/${IMAGE_NAME}.updraft"
UPDRAFT_BUNDLE_LINK ??= "${DEPLOY_DIR_IMAGE}/${IMAGE_LINK_NAME}.updraft"
# The script the steps are, found on BBPATH (this layer's scripts/).
UPDRAFT_RELEASE_SCRIPT ??= "${@bb.utils.which(d.getVar('BBPATH'), 'scripts/updraft-release-image')}"

IMAGE_FSTYPES:append = " ${UPDRAFT_RELEASE_FSTYPE}"

ROOTFS_POSTPROCESS_COMMAND += "updraft_release_marker"

updraft_release_marker() {
    ${UPDRAFT_RELEASE_SCRIPT} marker ${IMAGE_ROOTFS} '${UPDRAFT_RELEASE_VERSION}'
}
updraft_release_marker[file-checksums] += "${UPDRAFT_RELEASE_SCRIPT}:True"

python () {
    key = d.getVar('UPDRAFT_SIGNING_KEY') or ''
    if not key:
        return
    if not os.path.isabs(key):
        bb.fatal("UPDRAFT_SIGNING_KEY must be an absolute path outside the build tree, not '%s'" % key)
    key = os.path.realpath(key)
    for var in ('TOPDIR', 'TMPDIR', 'DEPLOY_DIR', 'SSTATE_DIR', 'DL_DIR'):
        top = d.getVar(var)
        if top and (key + '/').startswith(os.path.realpath(top) + '/'):
            bb.fatal("UPDRAFT_SIGNING_KEY %s is inside %s (%s): keep release keys outside the build tree" % (key, var, top))
}

do_updraft_release() {
    if [ -z "${UPDRAFT_SIGNING_KEY}" ]; then
        bbfatal "UPDRAFT_SIGNING_KEY is not set: the path of the release key, outside the build tree"
    fi
    set --
    for previous in ${UPDRAFT_PREVIOUS_IMAGE}; do
        set -- "$@" --from "$previous"
    done
    if [ -n "${UPDRAFT_KEY_DOCUMENTS}" ]; then
        set -- "$@" --key-documents "${UPDRAFT_KEY_DOCUMENTS}"
    fi
    if [ -n "${UPDRAFT_RELEASE_CHANNEL}" ]; then
        set -- "$@" --channel "${UPDRAFT_RELEASE_CHANNEL}"
    fi
    if [ -n "${UPDRAFT_RELEASE_SERIAL}" ]; then
        set -- "$@" --serial "${UPDRAFT_RELEASE_SERIAL}"
    fi
    UPDRAFT_PUBLISH=updraft-publish ${UPDRAFT_RELEASE_SCRIPT} publish \
        --image "${DEPLOY_DIR_IMAGE}/${IMAGE_LINK_NAME}.${UPDRAFT_RELEASE_FSTYPE}" \
        --version '${UPDRAFT_RELEASE_VERSION}' \
        --compatible '${UPDRAFT_COMPATIBLE}' \
        --key "${UPDRAFT_SIGNING_KEY}" \
        --out "${UPDRAFT_RELEASE_DIR}" \
        --bundle "${UPDRAFT_BUNDLE}" \
        "$@" -- ${UPDRAFT_PUBLISH_ARGS}
    ln -sf "$(basename "${UPDRAFT_BUNDLE}")" "${UPDRAFT_BUNDLE_LINK}"
}
do_updraft_release[doc] = "Signs the image as an updraft release: the release directory and a bundle in DEPLOY_DIR_IMAGE"
do_updraft_release[depends] += "updraft-publish-native:do_populate_sysroot"
do_updraft_release[vardepsexclude] += "UPDRAFT_SIGNING_KEY"
do_updraft_release[file-checksums] += "${UPDRAFT_RELEASE_SCRIPT}:True"
do_updraft_release[nostamp] = "1"
addtask updraft_release after do_image_complete before do_build
