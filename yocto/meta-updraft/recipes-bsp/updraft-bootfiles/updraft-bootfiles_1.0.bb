SUMMARY = "A/B slot selection for updraft: U-Boot boot script and GRUB configuration"
DESCRIPTION = "boot.scr for U-Boot (BOOT_ORDER, BOOT_A_LEFT, BOOT_B_LEFT) and \
               grub.cfg for GRUB (ORDER, A_OK, A_TRY, B_OK, B_TRY), both \
               passing updraft.slot=A|B on the kernel command line. They are \
               deployed next to the images for wic to place on the boot \
               partition (IMAGE_BOOT_FILES for U-Boot; the grub-efi \
               configfile and IMAGE_EFI_BOOT_FILES for GRUB)."
HOMEPAGE = "https://github.com/updraft-ota/updraft"
BUGTRACKER = "https://github.com/updraft-ota/updraft/issues"
SECTION = "bootloaders"
LICENSE = "Apache-2.0 | MIT"
LIC_FILES_CHKSUM = "file://boot.cmd.in;beginline=1;endline=1;md5=0b732c21d59f2de91cce72d468e6cfeb \
                    file://grub.cfg.in;beginline=1;endline=1;md5=0b732c21d59f2de91cce72d468e6cfeb"

DEPENDS = "u-boot-tools-native"

SRC_URI = "file://boot.cmd.in \
           file://grub.cfg.in \
           "

S = "${UNPACKDIR}"

inherit kernel-arch deploy nopackages

# Partition numbers of the two root filesystems (see wic/*.wks).
UPDRAFT_PART_A ??= "2"
UPDRAFT_PART_B ??= "3"
UPDRAFT_TRIES ??= "3"
UPDRAFT_PANIC_SECONDS ??= "10"
UPDRAFT_EXTRA_BOOTARGS ??= ""
# The kernel lives in each slot's root filesystem, so it is updated with it.
UPDRAFT_KERNEL_PATH ??= "/boot/${KERNEL_IMAGETYPE}"

# U-Boot: device holding the slots, root device prefix and boot command.
UPDRAFT_BOOT_DEV ??= "mmc 0"
UPDRAFT_ROOT_PREFIX ??= "/dev/mmcblk0p"
UPDRAFT_BOOT_CMD ??= "booti ${kernel_addr_r} - ${fdt_addr}"
# U-Boot: the environment hooks, run before the slot choice and where it is
# saved. By default U-Boot's own environment store (nothing to load, then
# saveenv). A board whose U-Boot cannot write its store can keep updraft's
# variables in a redundant pair of files on the FAT boot partition with the
# shipped fragments env-fat-load.cmd.in and env-fat-save.cmd.in (see
# docs/bootloaders.md): one command each here, e.g. sourcing them.
UPDRAFT_ENV_LOAD ??= ""
UPDRAFT_ENV_SAVE ??= "saveenv"

# GRUB: disk as GRUB names it and the partitions' GPT UUIDs (wic --uuid).
UPDRAFT_GRUB_DISK ??= "hd0"
UPDRAFT_GRUB_TIMEOUT ??= "0"
UPDRAFT_PARTUUID_A ??= "3b2a9c7e-4f1d-4d52-9a67-1c0e8f3d2a01"
UPDRAFT_PARTUUID_B ??= "3b2a9c7e-4f1d-4d52-9a67-1c0e8f3d2a02"
# GRUB: the partition map module's name as it appears in device names
# (gpt, or msdos for an MBR disk), the command loading the kernel (linux, or
# linux16 for the 16-bit boot protocol on BIOS machines) and a command run
# after it in each menu entry, e.g. "initrd16 (hd0,msdos1)/initrd.img" when
# the root file system needs an initramfs; empty: none.
UPDRAFT_GRUB_PARTMAP ??= "gpt"
UPDRAFT_GRUB_LINUX ??= "linux"
UPDRAFT_GRUB_INITRD ??= ""

do_configure[noexec] = "1"

do_compile() {
    for f in boot.cmd grub.cfg; do
        sed -e 's#@@UPDRAFT_PART_A@@#${UPDRAFT_PART_A}#g' \
            -e 's#@@UPDRAFT_PART_B@@#${UPDRAFT_PART_B}#g' \
            -e 's#@@UPDRAFT_TRIES@@#${UPDRAFT_TRIES}#g' \
            -e 's#@@UPDRAFT_PANIC_SECONDS@@#${UPDRAFT_PANIC_SECONDS}#g' \
            -e 's#@@UPDRAFT_EXTRA_BOOTARGS@@#${UPDRAFT_EXTRA_BOOTARGS}#g' \
            -e 's#@@UPDRAFT_KERNEL_PATH@@#${UPDRAFT_KERNEL_PATH}#g' \
            -e 's#@@UPDRAFT_BOOT_DEV@@#${UPDRAFT_BOOT_DEV}#g' \
            -e 's#@@UPDRAFT_ROOT_PREFIX@@#${UPDRAFT_ROOT_PREFIX}#g' \
            -e 's#@@UPDRAFT_BOOT_CMD@@#${UPDRAFT_BOOT_CMD}#g' \
            -e 's#@@UPDRAFT_ENV_LOAD@@#${UPDRAFT_ENV_LOAD}#g' \
            -e 's#@@UPDRAFT_ENV_SAVE@@#${UPDRAFT_ENV_SAVE}#g' \
            -e 's#@@UPDRAFT_GRUB_DISK@@#${UPDRAFT_GRUB_DISK}#g' \
            -e 's#@@UPDRAFT_GRUB_TIMEOUT@@#${UPDRAFT_GRUB_TIMEOUT}#g' \
            -e 's#@@UPDRAFT_PARTUUID_A@@#${UPDRAFT_PARTUUID_A}#g' \
            -e 's#@@UPDRAFT_PARTUUID_B@@#${UPDRAFT_PARTUUID_B}#g' \
            -e 's#@@UPDRAFT_GRUB_PARTMAP@@#${UPDRAFT_GRUB_PARTMAP}#g' \
            -e 's#@@UPDRAFT_GRUB_LINUX@@#${UPDRAFT_GRUB_LINUX}#g' \
            -e 's#@@UPDRAFT_GRUB_INITRD@@#${UPDRAFT_GRUB_INITRD}#g' \
            ${S}/$f.in > ${B}/$f
        if grep -n '@@' ${B}/$f; then
            bbfatal "$f: placeholders left unreplaced"
        fi
    done
    mkimage -A ${UBOOT_ARCH} -T script -C none -n "updraft A/B boot" -d ${B}/boot.cmd ${B}/boot.scr

    # The initial GRUB environment block (1024 bytes, as grub-editenv
    # writes it): slot A good, B empty. GRUB's save_env only rewrites an
    # existing block, so the image must carry one.
    printf '# GRUB Environment Block\nORDER=A B\nA_OK=1\nA_TRY=0\nB_OK=0\nB_TRY=0\n' > ${B}/grubenv
    pad=$(expr 1024 - $(wc -c < ${B}/grubenv))
    head -c $pad /dev/zero | tr '\0' '#' >> ${B}/grubenv
}

do_deploy() {
    install -d ${DEPLOYDIR}
    install -m 0644 ${B}/boot.scr ${DEPLOYDIR}/boot.scr
    install -m 0644 ${B}/grub.cfg ${DEPLOYDIR}/updraft-grub.cfg
    install -m 0644 ${B}/grubenv ${DEPLOYDIR}/updraft-grubenv
}

addtask deploy after do_compile before do_build

PACKAGE_ARCH = "${MACHINE_ARCH}"
