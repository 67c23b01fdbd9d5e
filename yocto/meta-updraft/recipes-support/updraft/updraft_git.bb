SUMMARY = "Over-the-air A/B update agent for Linux edge devices"
DESCRIPTION = "updraft polls a signed manifest over HTTPS, writes the inactive \
               slot of an A/B pair, switches the bootloader for a counted trial \
               boot, runs health checks and commits or rolls back."
HOMEPAGE = "https://github.com/updraft-ota/updraft"
BUGTRACKER = "https://github.com/updraft-ota/updraft/issues"
SECTION = "admin"
LICENSE = "Apache-2.0 | MIT"
CVE_PRODUCT = "updraft"
# The workspace manifest states the licence ("Apache-2.0 OR MIT").
LIC_FILES_CHKSUM = "file://Cargo.toml;beginline=10;endline=10;md5=b62ec12929096a5479d83e0aae7a4fe2"

# The commit to build. Releases set UPDRAFT_SRCREV (in a bbappend, the
# distro configuration or local.conf) to the commit whose Cargo.lock
# produced updraft-crates.inc; see README.md.
UPDRAFT_SRCREV ??= "0000000000000000000000000000000000000000"
UPDRAFT_BRANCH ??= "main"
PV = "0.1.0+git"

SRC_URI = "git://github.com/updraft-ota/updraft.git;protocol=https;branch=${UPDRAFT_BRANCH};destsuffix=${BP} \
           file://updraft.toml \
           "
SRCREV = "${UPDRAFT_SRCREV}"

require updraft-crates.inc

S = "${UNPACKDIR}/${BP}"

inherit cargo systemd useradd
# Packages the completion script as ${PN}-bash-completion.
inherit bash-completion

# Build the device binary only; the workspace also holds build-host tools.
CARGO_BUILD_FLAGS:append = " --package updraft --bin updraft"
# Recorded as the build time the agent refuses to trust a clock before.
export SOURCE_DATE_EPOCH
# SQLite features updraft does not use, left out for size; the same value as
# in the workspace's .cargo/config.toml, which cargo does not read here
# because it runs outside the source tree.
export LIBSQLITE3_FLAGS = "-USQLITE_ENABLE_FTS3 -USQLITE_ENABLE_FTS3_PARENTHESIS -USQLITE_ENABLE_FTS5 -USQLITE_ENABLE_RTREE -USQLITE_ENABLE_DBSTAT_VTAB -USQLITE_ENABLE_STAT4 -USQLITE_SOUNDEX -USQLITE_ENABLE_COLUMN_METADATA -USQLITE_ENABLE_LOAD_EXTENSION -DSQLITE_OMIT_LOAD_EXTENSION -DSQLITE_OMIT_DEPRECATED -DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_OMIT_SHARED_CACHE -DSQLITE_LIKE_DOESNT_MATCH_BLOBS -DSQLITE_OMIT_JSON -DSQLITE_OMIT_DATETIME_FUNCS -DSQLITE_OMIT_PROGRESS_CALLBACK -DSQLITE_OMIT_TRACE -DSQLITE_OMIT_UTF16 -DSQLITE_OMIT_COMPLETE -DSQLITE_OMIT_TCL_VARIABLE -DSQLITE_OMIT_GET_TABLE -DSQLITE_OMIT_INTROSPECTION_PRAGMAS -DSQLITE_OMIT_DESERIALIZE -DSQLITE_OMIT_AUTHORIZATION -DSQLITE_OMIT_WAL -DSQLITE_OMIT_DECLTYPE -DSQLITE_OMIT_AUTOMATIC_INDEX -DSQLITE_DQS=0 -DSQLITE_OMIT_SCHEMA_PRAGMAS -DSQLITE_OMIT_SCHEMA_VERSION_PRAGMAS -DSQLITE_OMIT_COMPILEOPTION_DIAGS -DSQLITE_OMIT_AUTOVACUUM -DSQLITE_OMIT_INCRBLOB -DSQLITE_OMIT_BETWEEN_OPTIMIZATION -DSQLITE_OMIT_LIKE_OPTIMIZATION -DSQLITE_OMIT_OR_OPTIMIZATION -DSQLITE_OMIT_XFER_OPT -DSQLITE_OMIT_TRUNCATE_OPTIMIZATION -DSQLITE_OMIT_CASE_SENSITIVE_LIKE_PRAGMA -DSQLITE_OMIT_BLOB_LITERAL -DSQLITE_OMIT_HEX_INTEGER -DSQLITE_OMIT_SHUTDOWN_DIRECTORIES -DSQLITE_UNTESTABLE -USQLITE_ENABLE_MEMORY_MANAGEMENT"

# Board settings written into /etc/updraft/updraft.toml.
UPDRAFT_COMPATIBLE ??= "${MACHINE}"
UPDRAFT_SLOT_A ??= "/dev/mmcblk0p2"
UPDRAFT_SLOT_B ??= "/dev/mmcblk0p3"
UPDRAFT_BOOTLOADER ??= "uboot"
UPDRAFT_MANIFEST_URL ??= ""
# The fleet's root public key (PEM, as `updraft-publish keygen` writes it),
# a path on the build host, installed as /etc/updraft/keys/root.pub. Public
# material; its private half stays offline. Empty: the image ships no key.
UPDRAFT_ROOT_KEY ??= ""
# U-Boot boards: the lines of /etc/fw_env.config ("DEVICE OFFSET SIZE"),
# for the environment and its redundant copy, in the package
# ${PN}-fw-env. Empty: the board support's own fw_env.config is used.
UPDRAFT_FW_ENV ??= ""
UPDRAFT_FW_ENV_REDUND ??= ""

USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system updraft"

SYSTEMD_SERVICE:${PN} = "updraft.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/updraft.service ${D}${systemd_system_unitdir}/updraft.service
    sed -i -e 's#^ExecStart=[^ ]*/updraft #ExecStart=${bindir}/updraft #' \
        ${D}${systemd_system_unitdir}/updraft.service

    install -d ${D}${nonarch_libdir}/tmpfiles.d ${D}${nonarch_libdir}/sysusers.d
    install -m 0644 ${S}/systemd/updraft.tmpfiles ${D}${nonarch_libdir}/tmpfiles.d/updraft.conf
    install -m 0644 ${S}/systemd/updraft.sysusers ${D}${nonarch_libdir}/sysusers.d/updraft.conf

    # The journal catalog: what `journalctl -x` shows beside updraft's
    # entries (systemd-journal-catalog-update.service rebuilds the index).
    install -d ${D}${nonarch_libdir}/systemd/catalog
    install -m 0644 ${S}/systemd/updraft.catalog ${D}${nonarch_libdir}/systemd/catalog/updraft.catalog

    install -d ${D}${docdir}/${PN}
    install -m 0644 ${S}/systemd/updraft.service.d/50-health-checks.conf.example ${D}${docdir}/${PN}/

    # The script `updraft completions bash` prints.
    install -d ${D}${datadir}/bash-completion/completions
    install -m 0644 ${S}/contrib/bash-completion/updraft ${D}${datadir}/bash-completion/completions/updraft

    install -d ${D}${sysconfdir}/updraft/health.d ${D}${sysconfdir}/updraft/keys
    install -m 0644 ${UNPACKDIR}/updraft.toml ${D}${sysconfdir}/updraft/updraft.toml
    sed -i -e 's#@COMPATIBLE@#${UPDRAFT_COMPATIBLE}#' \
        -e 's#@SLOT_A@#${UPDRAFT_SLOT_A}#' \
        -e 's#@SLOT_B@#${UPDRAFT_SLOT_B}#' \
        -e 's#@BOOTLOADER@#${UPDRAFT_BOOTLOADER}#' \
        -e 's#@MANIFEST_URL@#${UPDRAFT_MANIFEST_URL}#' \
        ${D}${sysconfdir}/updraft/updraft.toml

    if [ -n "${UPDRAFT_ROOT_KEY}" ]; then
        install -m 0644 ${UPDRAFT_ROOT_KEY} ${D}${sysconfdir}/updraft/keys/root.pub
    fi
    if [ -n "${UPDRAFT_FW_ENV}" ]; then
        printf '# DEVICE OFFSET SIZE, written by the updraft recipe\n%s\n' "${UPDRAFT_FW_ENV}" \
            > ${D}${sysconfdir}/fw_env.config
        if [ -n "${UPDRAFT_FW_ENV_REDUND}" ]; then
            printf '%s\n' "${UPDRAFT_FW_ENV_REDUND}" >> ${D}${sysconfdir}/fw_env.config
        fi
        chmod 0644 ${D}${sysconfdir}/fw_env.config
    fi
}
# The root key is read from the build host: its content is part of the
# task's signature.
do_install[file-checksums] += "${@'${UPDRAFT_ROOT_KEY}:True' if d.getVar('UPDRAFT_ROOT_KEY') else ''}"

PACKAGES =+ "${PN}-fw-env"
FILES:${PN}-fw-env += "${sysconfdir}/fw_env.config"
CONFFILES:${PN}-fw-env = "${sysconfdir}/fw_env.config"

FILES:${PN} += "${systemd_system_unitdir}/updraft.service \
                ${nonarch_libdir}/tmpfiles.d/updraft.conf \
                ${nonarch_libdir}/sysusers.d/updraft.conf \
                ${nonarch_libdir}/systemd/catalog/updraft.catalog \
                "
CONFFILES:${PN} = "${sysconfdir}/updraft/updraft.toml"

# The U-Boot backend locks and reads the environment the way libubootenv
# does; fw_printenv/fw_setenv are handy for inspecting it on the device.
RRECOMMENDS:${PN} = "${@'libubootenv-bin' if d.getVar('UPDRAFT_BOOTLOADER') == 'uboot' else ''} \
                     ${@'${PN}-fw-env' if d.getVar('UPDRAFT_FW_ENV') else ''}"
