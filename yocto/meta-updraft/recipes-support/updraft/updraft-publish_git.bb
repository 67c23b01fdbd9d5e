SUMMARY = "Publisher of signed updraft releases, bundles and deltas"
DESCRIPTION = "updraft-publish makes the keys, key documents, signed manifests, \
               framed images, deltas and single-file bundles updraft devices \
               install. The updraft-release class runs it natively to turn an \
               image into a release."
HOMEPAGE = "https://github.com/updraft-ota/updraft"
BUGTRACKER = "https://github.com/updraft-ota/updraft/issues"
SECTION = "devel"
LICENSE = "Apache-2.0 | MIT"
CVE_PRODUCT = "updraft"
# The workspace manifest states the licence ("Apache-2.0 OR MIT").
LIC_FILES_CHKSUM = "file://Cargo.toml;beginline=10;endline=10;md5=b62ec12929096a5479d83e0aae7a4fe2"

# The same source and crate list as the agent (updraft_git.bb): one commit
# of the workspace builds both.
UPDRAFT_SRCREV ??= "0000000000000000000000000000000000000000"
UPDRAFT_BRANCH ??= "main"
PV = "0.1.0+git"

SRC_URI = "git://github.com/updraft-ota/updraft.git;protocol=https;branch=${UPDRAFT_BRANCH};destsuffix=${BP}"
SRCREV = "${UPDRAFT_SRCREV}"

require updraft-crates.inc

S = "${UNPACKDIR}/${BP}"

inherit cargo

# The publisher only; the workspace also holds the agent and test tools.
CARGO_BUILD_FLAGS:append = " --package updraft-publish --bin updraft-publish"
# The agent's library, which the publisher links, bundles SQLite; the same
# flags as updraft_git.bb and the workspace's .cargo/config.toml.
export LIBSQLITE3_FLAGS = "-USQLITE_ENABLE_FTS3 -USQLITE_ENABLE_FTS3_PARENTHESIS -USQLITE_ENABLE_FTS5 -USQLITE_ENABLE_RTREE -USQLITE_ENABLE_DBSTAT_VTAB -USQLITE_ENABLE_STAT4 -USQLITE_SOUNDEX -USQLITE_ENABLE_COLUMN_METADATA -USQLITE_ENABLE_LOAD_EXTENSION -DSQLITE_OMIT_LOAD_EXTENSION -DSQLITE_OMIT_DEPRECATED -DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_OMIT_SHARED_CACHE -DSQLITE_LIKE_DOESNT_MATCH_BLOBS -DSQLITE_OMIT_JSON -DSQLITE_OMIT_DATETIME_FUNCS -DSQLITE_OMIT_PROGRESS_CALLBACK -DSQLITE_OMIT_TRACE -DSQLITE_OMIT_UTF16 -DSQLITE_OMIT_COMPLETE -DSQLITE_OMIT_TCL_VARIABLE -DSQLITE_OMIT_GET_TABLE -DSQLITE_OMIT_INTROSPECTION_PRAGMAS -DSQLITE_OMIT_DESERIALIZE -DSQLITE_OMIT_AUTHORIZATION -DSQLITE_OMIT_WAL -DSQLITE_OMIT_DECLTYPE -DSQLITE_OMIT_AUTOMATIC_INDEX -DSQLITE_DQS=0 -DSQLITE_OMIT_SCHEMA_PRAGMAS -DSQLITE_OMIT_SCHEMA_VERSION_PRAGMAS -DSQLITE_OMIT_COMPILEOPTION_DIAGS -DSQLITE_OMIT_AUTOVACUUM -DSQLITE_OMIT_INCRBLOB -DSQLITE_OMIT_BETWEEN_OPTIMIZATION -DSQLITE_OMIT_LIKE_OPTIMIZATION -DSQLITE_OMIT_OR_OPTIMIZATION -DSQLITE_OMIT_XFER_OPT -DSQLITE_OMIT_TRUNCATE_OPTIMIZATION -DSQLITE_OMIT_CASE_SENSITIVE_LIKE_PRAGMA -DSQLITE_OMIT_BLOB_LITERAL -DSQLITE_OMIT_HEX_INTEGER -DSQLITE_OMIT_SHUTDOWN_DIRECTORIES -DSQLITE_UNTESTABLE -USQLITE_ENABLE_MEMORY_MANAGEMENT"

# A build-host tool: the updraft-release class depends on the native one.
BBCLASSEXTEND = "native nativesdk"
