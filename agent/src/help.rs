//! Help texts of the command-line tools: the shape of a subcommand table,
//! its `--help` rendering and the bash completion script made from it.
//!
//! `updraft` and `updraft-publish` each describe their subcommands once, as
//! a [`Program`] of [`Command`]s with their [`Opt`]ions and examples. The
//! parsers accept exactly the options listed there, `--help`/`-h` prints the
//! entry, and `completions bash` is generated from the same table, so usage
//! text, parsing and completion cannot disagree. This module only formats:
//! it parses no arguments and runs nothing.

/// One option: `--name VALUE` (a switch when `value` is empty).
#[derive(Debug)]
pub struct Opt {
    /// `--name`.
    pub name: &'static str,
    /// Short form, e.g. `-c`; empty when there is none.
    pub short: &'static str,
    /// Placeholder of the value it takes; empty for a switch.
    pub value: &'static str,
    pub help: &'static str,
}

impl Opt {
    /// True when `arg` names this option (`--name` or its short form).
    pub fn is(&self, arg: &str) -> bool {
        arg == self.name || (!self.short.is_empty() && arg == self.short)
    }

    fn left(&self) -> String {
        let short = if self.short.is_empty() {
            "    ".to_string()
        } else {
            format!("{}, ", self.short)
        };
        if self.value.is_empty() {
            format!("{short}{}", self.name)
        } else {
            format!("{short}{} {}", self.name, self.value)
        }
    }
}

/// A subcommand's entry.
#[derive(Debug)]
pub struct Command {
    pub name: &'static str,
    /// One line, for the overview and the first line of the help.
    pub summary: &'static str,
    /// The synopsis (continuation lines indented by six spaces).
    pub usage: &'static str,
    /// More about the command; may be empty.
    pub about: &'static str,
    pub options: &'static [Opt],
    /// Words completed as the command's arguments (besides its options).
    pub words: &'static [&'static str],
    pub examples: &'static [&'static str],
}

/// A program and its subcommands.
#[derive(Debug)]
pub struct Program {
    pub name: &'static str,
    pub version: &'static str,
    pub summary: &'static str,
    pub usage: &'static str,
    /// Options accepted with every subcommand (e.g. `--config`).
    pub common: &'static [Opt],
    pub commands: &'static [Command],
    pub examples: &'static [&'static str],
}

/// `--help` and `-h`, accepted everywhere.
pub const HELP: Opt = Opt {
    name: "--help",
    short: "-h",
    value: "",
    help: "print this help and exit",
};

/// `--version` and `-V`.
pub const VERSION: Opt = Opt {
    name: "--version",
    short: "-V",
    value: "",
    help: "print the version and exit",
};

/// True for `--help` and `-h`.
pub fn is_help(arg: &str) -> bool {
    HELP.is(arg)
}

impl Program {
    pub fn command(&self, name: &str) -> Option<&'static Command> {
        self.commands.iter().find(|c| c.name == name)
    }

    /// `PROGRAM --help`: what it is, its commands, options and examples.
    pub fn overview(&self) -> String {
        let mut out = format!(
            "{} {}: {}\n\nusage: {}\n\ncommands:\n",
            self.name, self.version, self.summary, self.usage
        );
        let width = self
            .commands
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0);
        for c in self.commands {
            out.push_str(&format!("  {:<width$}  {}\n", c.name, c.summary));
        }
        let opts: Vec<&Opt> = self.common.iter().chain([&VERSION, &HELP]).collect();
        options(&mut out, &opts);
        examples(&mut out, self.examples);
        out.push_str(&format!(
            "\n`{} COMMAND --help` describes a command.\n",
            self.name
        ));
        out
    }

    /// `PROGRAM COMMAND --help`: usage, options and examples of one command.
    pub fn help(&self, c: &Command) -> String {
        let mut out = format!(
            "{} {}: {}\n\nusage: {}\n",
            self.name, c.name, c.summary, c.usage
        );
        if !c.about.is_empty() {
            out.push_str(&format!("\n{}\n", c.about));
        }
        let opts: Vec<&Opt> = c.options.iter().chain(self.common).chain([&HELP]).collect();
        options(&mut out, &opts);
        examples(&mut out, c.examples);
        out
    }

    /// The short form shown with a usage error: the synopsis, and where to
    /// read more.
    pub fn usage_hint(&self, c: Option<&Command>) -> String {
        match c {
            Some(c) => format!(
                "usage: {}\n(`{} {} --help` for more)",
                c.usage, self.name, c.name
            ),
            None => format!("usage: {}\n(`{} --help` for more)", self.usage, self.name),
        }
    }

    /// A bash completion script: command names first, then each command's
    /// options and words; the value of an option is completed by bash's
    /// default (file names).
    pub fn bash_completion(&self) -> String {
        let func = format!("_{}", self.name.replace('-', "_"));
        let names: Vec<&str> = self.commands.iter().map(|c| c.name).collect();
        // Options that take a value, in both spellings, for a word list.
        let valued = |opts: &mut dyn Iterator<Item = &Opt>| {
            let mut v = Vec::new();
            for o in opts.filter(|o| !o.value.is_empty()) {
                v.push(o.name);
                if !o.short.is_empty() {
                    v.push(o.short);
                }
            }
            v.join(" ")
        };
        let mut top: Vec<&str> = names.clone();
        top.extend(self.common.iter().map(|o| o.name));
        top.extend([VERSION.name, HELP.name]);
        let mut cases = format!(
            "        '') values=\"{}\" words=\"{}\" ;;\n",
            valued(&mut self.common.iter()),
            top.join(" ")
        );
        for c in self.commands {
            let mut words: Vec<&str> = c.options.iter().map(|o| o.name).collect();
            words.extend(self.common.iter().map(|o| o.name));
            words.push(HELP.name);
            if c.name == "help" {
                words.extend(names.iter().copied());
            }
            words.extend(c.words.iter().copied());
            cases.push_str(&format!(
                "        {}) values=\"{}\" words=\"{}\" ;;\n",
                c.name,
                valued(&mut c.options.iter().chain(self.common)),
                words.join(" ")
            ));
        }
        let common = valued(&mut self.common.iter());
        let skip = if common.is_empty() {
            String::new()
        } else {
            format!("            {}) skip=1 ;;\n", common.replace(' ', "|"))
        };
        format!(
            "# bash completion for {name} (made by `{name} completions bash`)\n\
             {func}() {{\n\
             \x20   local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}\n\
             \x20   local i cmd= skip=0 values words\n\
             \x20   COMPREPLY=()\n\
             \x20   for ((i = 1; i < COMP_CWORD; i++)); do\n\
             \x20       if ((skip)); then skip=0; continue; fi\n\
             \x20       case ${{COMP_WORDS[i]}} in\n\
             {skip}\
             \x20           -*) ;;\n\
             \x20           *) cmd=${{COMP_WORDS[i]}}; break ;;\n\
             \x20       esac\n\
             \x20   done\n\
             \x20   case $cmd in\n\
             {cases}\
             \x20       *) return ;;\n\
             \x20   esac\n\
             \x20   # The value of an option: leave it to bash (file names).\n\
             \x20   [[ $prev == -* && \" $values \" == *\" $prev \"* ]] && return\n\
             \x20   COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n\
             }}\n\
             complete -o default -F {func} {name}\n",
            name = self.name,
        )
    }
}

fn options(out: &mut String, opts: &[&Opt]) {
    let width = opts.iter().map(|o| o.left().len()).max().unwrap_or(0);
    out.push_str("\noptions:\n");
    for o in opts {
        out.push_str(&format!("  {:<width$}  {}\n", o.left(), o.help));
    }
}

fn examples(out: &mut String, ex: &[&str]) {
    if ex.is_empty() {
        return;
    }
    out.push_str(if ex.len() == 1 {
        "\nexample:\n"
    } else {
        "\nexamples:\n"
    });
    for e in ex {
        out.push_str(&format!("  {e}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: Program = Program {
        name: "demo-tool",
        version: "1.0",
        summary: "a demonstration",
        usage: "demo-tool [--config FILE] COMMAND",
        common: &[Opt {
            name: "--config",
            short: "-c",
            value: "FILE",
            help: "configuration",
        }],
        commands: &[
            Command {
                name: "show",
                summary: "show things",
                usage: "demo-tool [--config FILE] show [--json]",
                about: "",
                options: &[Opt {
                    name: "--json",
                    short: "",
                    value: "",
                    help: "as JSON",
                }],
                words: &[],
                examples: &["demo-tool show --json"],
            },
            Command {
                name: "help",
                summary: "describe a command",
                usage: "demo-tool help [COMMAND]",
                about: "",
                options: &[],
                words: &[],
                examples: &["demo-tool help show"],
            },
        ],
        examples: &["demo-tool show"],
    };

    #[test]
    fn a_command_help_has_usage_options_and_an_example() {
        let h = DEMO.help(DEMO.command("show").unwrap());
        assert_eq!(
            h,
            "demo-tool show: show things\n\n\
             usage: demo-tool [--config FILE] show [--json]\n\n\
             options:\n\
             \x20     --json         as JSON\n\
             \x20 -c, --config FILE  configuration\n\
             \x20 -h, --help         print this help and exit\n\n\
             example:\n\
             \x20 demo-tool show --json\n"
        );
    }

    #[test]
    fn the_overview_lists_every_command() {
        let o = DEMO.overview();
        assert!(o.contains("\n  show  show things\n"), "{o}");
        assert!(o.contains("\n  help  describe a command\n"), "{o}");
        assert!(o.contains("-V, --version"), "{o}");
        assert!(o.contains("example:\n  demo-tool show\n"), "{o}");
    }

    #[test]
    fn completion_knows_commands_options_and_option_values() {
        let s = DEMO.bash_completion();
        assert!(
            s.contains("complete -o default -F _demo_tool demo-tool\n"),
            "{s}"
        );
        assert!(
            s.contains("'') values=\"--config -c\" words=\"show help --config --version --help\""),
            "{s}"
        );
        assert!(
            s.contains("show) values=\"--config -c\" words=\"--json --config --help\""),
            "{s}"
        );
        assert!(
            s.contains("help) values=\"--config -c\" words=\"--config --help show help\""),
            "{s}"
        );
        // The value of --config is skipped when looking for the command.
        assert!(s.contains("--config|-c) skip=1"), "{s}");
    }

    #[test]
    fn is_help_takes_both_spellings() {
        assert!(is_help("--help") && is_help("-h"));
        assert!(!is_help("help") && !is_help("--helpful"));
    }
}
