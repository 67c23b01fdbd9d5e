//! Command-line conventions of both binaries: `--help` and `-h` on the
//! program and on every subcommand print that command's usage, options and
//! an example on stdout and exit 0, without reading a configuration;
//! unknown options are usage errors (exit 2) that name the option; the
//! bash completion scripts complete commands and options, and the copies in
//! `contrib/bash-completion/` that packages install are current.

use std::process::Output;

use updraft_tests::bin;

/// `updraft`'s subcommands (DESIGN.md's contract plus `help` and
/// `completions`).
const UPDRAFT: &[&str] = &[
    "daemon",
    "status",
    "check",
    "install",
    "mark-good",
    "mark-bad",
    "history",
    "help",
    "completions",
];

/// `updraft-publish`'s subcommands.
const PUBLISH: &[&str] = &[
    "keygen",
    "keys",
    "release",
    "verify",
    "verify-reports",
    "inspect",
    "help",
    "completions",
];

fn run(program: &str, args: &[&str]) -> Output {
    bin::command(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run and insist on exit 0 with nothing on stderr; returns stdout.
fn help_of(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{program} {args:?} exited {}:\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{program} {args:?} wrote to stderr:\n{}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// What every subcommand's help must hold: the usage line naming the
/// command, an options section (with `--help` in it), and an example that
/// runs the command.
fn assert_command_help(program: &str, cmd: &str, help: &str) {
    let usage = help
        .lines()
        .find(|l| l.starts_with("usage: "))
        .unwrap_or_else(|| panic!("{program} {cmd} --help has no usage line:\n{help}"));
    assert!(
        usage.starts_with(&format!("usage: {program} ")) && usage.contains(&format!(" {cmd}")),
        "the usage line of {program} {cmd} does not name it: {usage:?}"
    );
    assert!(help.contains("\noptions:\n"), "{program} {cmd}:\n{help}");
    assert!(help.contains("-h, --help"), "{program} {cmd}:\n{help}");
    let examples: Vec<&str> = help
        .split_once("\nexample")
        .unwrap_or_else(|| panic!("{program} {cmd} --help has no example:\n{help}"))
        .1
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert!(
        examples
            .iter()
            .any(|e| e.contains(&format!("{program} ")) && e.contains(cmd)),
        "no example of {program} {cmd} runs it: {examples:?}\n{help}"
    );
}

#[test]
fn every_updraft_command_answers_help_and_h() {
    for cmd in UPDRAFT {
        let long = help_of("updraft", &[cmd, "--help"]);
        assert_command_help("updraft", cmd, &long);
        assert_eq!(
            help_of("updraft", &[cmd, "-h"]),
            long,
            "updraft {cmd} -h differs from --help"
        );
        assert_eq!(
            help_of("updraft", &["help", cmd]),
            long,
            "updraft help {cmd} differs from updraft {cmd} --help"
        );
        // Help needs no configuration, and other arguments do not matter.
        assert_eq!(
            help_of(
                "updraft",
                &["--config", "/nonexistent/updraft.toml", cmd, "--help"]
            ),
            long
        );
    }
    // Options the command takes are in its help.
    for (cmd, opt) in [("status", "--json"), ("history", "--json")] {
        let h = help_of("updraft", &[cmd, "--help"]);
        assert!(h.contains(opt), "updraft {cmd} --help lacks {opt}:\n{h}");
    }
    let h = help_of("updraft", &["install", "--help"]);
    assert!(h.contains("MANIFEST_URL_OR_PATH"), "{h}");
}

#[test]
fn the_updraft_overview_lists_every_command() {
    let overview = help_of("updraft", &["--help"]);
    assert_eq!(help_of("updraft", &["-h"]), overview);
    assert_eq!(help_of("updraft", &["help"]), overview);
    assert!(overview.contains("usage: updraft "), "{overview}");
    for cmd in UPDRAFT {
        assert!(
            overview.lines().any(|l| l.trim_start().starts_with(cmd)),
            "the overview does not list {cmd}:\n{overview}"
        );
    }
    assert!(overview.contains("--config FILE"), "{overview}");
    assert!(overview.contains("\nexample"), "{overview}");
    assert_eq!(
        help_of("updraft", &["--version"]).trim(),
        format!("updraft {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn every_updraft_publish_command_answers_help_and_h() {
    for cmd in PUBLISH {
        let long = help_of("updraft-publish", &[cmd, "--help"]);
        assert_command_help("updraft-publish", cmd, &long);
        assert_eq!(help_of("updraft-publish", &[cmd, "-h"]), long, "{cmd} -h");
        assert_eq!(
            help_of("updraft-publish", &["help", cmd]),
            long,
            "help {cmd}"
        );
    }
    // `--help` wins over everything else on the line, required options
    // missing or not.
    let h = help_of("updraft-publish", &["release", "--key", "k.key", "--help"]);
    assert_command_help("updraft-publish", "release", &h);
    for opt in [
        "--key",
        "--version",
        "--compatible",
        "--image",
        "--from",
        "--serial",
        "--expires",
        "--rollout",
        "--out",
    ] {
        assert!(h.contains(opt), "release --help lacks {opt}:\n{h}");
    }
    let overview = help_of("updraft-publish", &["--help"]);
    assert_eq!(help_of("updraft-publish", &["-h"]), overview);
    for cmd in PUBLISH {
        assert!(
            overview.lines().any(|l| l.trim_start().starts_with(cmd)),
            "the overview does not list {cmd}:\n{overview}"
        );
    }
}

/// Exit 2, nothing on stdout, and stderr names what was wrong and shows
/// the usage.
fn usage_error(program: &str, args: &[&str], names: &str, usage: &str) {
    let out = run(program, args);
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{program} {args:?} exited {}:\n{err}",
        out.status
    );
    assert!(out.stdout.is_empty(), "{program} {args:?} wrote to stdout");
    assert!(
        err.starts_with(&format!("{program}: "))
            && err.lines().next().unwrap_or("").contains(names),
        "the first line does not name {names:?}:\n{err}"
    );
    assert!(err.contains(usage), "no usage {usage:?} in:\n{err}");
}

#[test]
fn unknown_options_and_commands_are_usage_errors_that_name_them() {
    usage_error(
        "updraft",
        &["status", "--yaml"],
        "unknown option --yaml",
        "usage: updraft [--config FILE] status [--json]",
    );
    usage_error(
        "updraft",
        &["mark-good", "-x"],
        "unknown option -x",
        "usage: updraft [--config FILE] mark-good",
    );
    usage_error(
        "updraft",
        &["check", "now"],
        "\"now\"",
        "usage: updraft [--config FILE] check",
    );
    usage_error(
        "updraft",
        &["frobnicate"],
        "unknown command \"frobnicate\"",
        "usage: updraft ",
    );
    usage_error(
        "updraft",
        &["help", "frobnicate"],
        "\"frobnicate\"",
        "usage: updraft help",
    );
    usage_error(
        "updraft-publish",
        &["release", "--frobnicate", "1"],
        "unknown option --frobnicate",
        "usage: updraft-publish release",
    );
    usage_error(
        "updraft-publish",
        &["verify", "-x", "site/manifest.json"],
        "unknown option -x",
        "usage: updraft-publish verify",
    );
    usage_error(
        "updraft-publish",
        &["inspect", "--json=yes", "m.json"],
        "--json",
        "usage: updraft-publish inspect",
    );
    usage_error(
        "updraft-publish",
        &["keygen", "--out", "k", "extra"],
        "\"extra\"",
        "usage: updraft-publish keygen",
    );
    usage_error(
        "updraft-publish",
        &["sign"],
        "unknown command \"sign\"",
        "usage: updraft-publish ",
    );
}

/// What bash completes for `words` (the last one being completed) with
/// `program`'s completion script loaded.
fn complete(program: &str, words: &[&str]) -> Vec<String> {
    let script = help_of(program, &["completions", "bash"]);
    let func = format!("_{}", program.replace('-', "_"));
    let quoted: Vec<String> = words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect();
    let driver = format!(
        "{script}\nCOMP_WORDS=({program} {})\nCOMP_CWORD={}\n{func}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        quoted.join(" "),
        words.len()
    );
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &driver])
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "bash failed on the completion script: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_completes_commands_and_their_options() {
    if !updraft_tests::skip::on_path("bash") {
        updraft_tests::skip!("bash is not installed");
    }
    let s = help_of("updraft", &["completions", "bash"]);
    assert!(
        s.contains("complete -o default -F _updraft updraft\n"),
        "{s}"
    );
    assert_eq!(complete("updraft", &["st"]), ["status"]);
    assert_eq!(complete("updraft", &["mark-"]), ["mark-good", "mark-bad"]);
    assert_eq!(complete("updraft", &["status", "--j"]), ["--json"]);
    // The value of --config is not taken for the command.
    assert_eq!(
        complete("updraft", &["--config", "/etc/x.toml", "history", "--"]),
        ["--json", "--config", "--help"]
    );
    // A file argument or an option's value is left to bash (file names).
    assert!(complete("updraft", &["--config", ""]).is_empty());
    assert!(complete("updraft", &["install", "/media/"]).is_empty());
    assert_eq!(complete("updraft", &["help", "ins"]), ["install"]);
    assert_eq!(
        complete("updraft", &["completions", ""]),
        ["--config", "--help", "bash"]
    );

    assert_eq!(complete("updraft-publish", &["rel"]), ["release"]);
    assert_eq!(
        complete("updraft-publish", &["release", "--ro"]),
        ["--rollout"]
    );
    assert!(complete("updraft-publish", &["release", "--key", ""]).is_empty());
    assert_eq!(
        complete("updraft-publish", &["verify", "--key", "x", "--"]),
        [
            "--pub",
            "--threshold",
            "--builder-pub",
            "--builder-threshold",
            "--help"
        ]
    );
}

#[test]
fn the_shipped_completion_scripts_are_what_the_binaries_print() {
    for program in ["updraft", "updraft-publish"] {
        let path = updraft_tests::repo_root()
            .join("contrib/bash-completion")
            .join(program);
        let shipped = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert_eq!(
            shipped,
            help_of(program, &["completions", "bash"]),
            "{} is stale: regenerate it with `{program} completions bash`",
            path.display()
        );
    }
}
