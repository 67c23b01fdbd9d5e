//! `cargo xtask layout`: the shape of the agent's code, measured.
//!
//! Two rules keep the agent readable as it grows (docs/architecture.md,
//! "Rules that hold everywhere"):
//!
//! - **No import cycle between the agent's top-level modules.** A module
//!   that needs another's concern and is needed by it is one concern in two
//!   files, or a missing third module.
//! - **No file over [`MAX_CODE_LINES`] lines of code** (blank lines,
//!   comments and the `#[cfg(test)]` module at the end not counted): a
//!   file past it holds more than one concern.
//!
//! The test at the bottom holds the tree to both, so a change that breaks
//! one fails `cargo xtask test`; the command prints the figures (the
//! largest files, every cycle, and how many files outside the server
//! modules name the DDI mode).
//!
//! This reads source text with a deliberately small parser: `crate::name`
//! paths and `use crate::{…}` groups outside comments and tests. It never
//! builds or runs anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::util::{Result, root};

/// The most lines of code an agent source file may hold.
pub const MAX_CODE_LINES: usize = 800;

/// The modules that are the DDI mode and its seam: references elsewhere
/// are the mode leaking past the seam (the configuration's and the
/// status's DDI keys are the contract, and counted all the same).
const DDI_MODULES: [&str; 4] = ["ddi", "hawkbit", "machine/fleet", "machine/server"];

/// One source file of the agent.
struct Source {
    /// Path below `agent/src`, e.g. `machine/check.rs`.
    rel: String,
    /// The top-level module it belongs to (`machine`).
    module: String,
    /// Its code without comments and without the trailing test module.
    code: Vec<String>,
}

/// The code of `text` as lines: comment lines, blank lines and everything
/// from a top-level `#[cfg(test)]` module on are left out; a trailing
/// `// …` comment is cut from a line.
fn code_lines(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        let next = lines.get(i + 1).map_or("", |l| l.trim_start());
        if *line == "#[cfg(test)]" && next.starts_with("mod ") {
            break;
        }
        if t.is_empty() || t.starts_with("//") {
            continue;
        }
        out.push(strip_trailing_comment(t).trim_end().to_string());
    }
    out
}

/// A line without a trailing `//` comment, where the `//` is outside a
/// string literal (good enough for this code: no raw strings hold `//`
/// followed by a path of interest).
fn strip_trailing_comment(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = '\0';
    for (i, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && prev == '/' => return &line[..i - 1],
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { '\0' } else { c };
    }
    line
}

/// The top-level modules `code` refers to: `crate::name` anywhere, and the
/// names of a `use crate::{a, b::c}` group.
fn references(code: &[String]) -> BTreeSet<String> {
    let joined = code.join("\n");
    let mut out = BTreeSet::new();
    let mut rest = joined.as_str();
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = matching_brace(group).unwrap_or(group.len());
            for part in split_top_level(&group[..end]) {
                let name = ident_prefix(part.trim());
                if !name.is_empty() {
                    out.insert(name.to_string());
                }
            }
        } else {
            let name = ident_prefix(after);
            if !name.is_empty() {
                out.insert(name.to_string());
            }
        }
        rest = after;
    }
    out
}

fn ident_prefix(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The index of the `}` closing a group whose `{` came just before `s`.
fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let path = entry.map_err(|e| format!("{}: {e}", d.display()))?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The agent's sources, but the crate roots and the crate's test support.
fn agent_sources(src: &Path) -> Result<Vec<Source>> {
    let mut out = Vec::new();
    for path in rust_files(src)? {
        let rel = path
            .strip_prefix(src)
            .map_err(|e| e.to_string())?
            .to_string_lossy()
            .into_owned();
        let module = rel
            .split('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_string();
        if matches!(module.as_str(), "lib" | "main" | "test_support") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(Source {
            rel,
            module,
            code: code_lines(&text),
        });
    }
    Ok(out)
}

/// The module graph: each top-level module and the others it refers to.
fn module_graph(sources: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources {
        g.entry(s.module.clone()).or_default();
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for s in sources {
        let refs = references(&s.code);
        let edges = g.entry(s.module.clone()).or_default();
        for r in refs {
            if r != s.module && names.contains(&r) {
                edges.insert(r);
            }
        }
    }
    g
}

/// The strongly connected components of more than one module: the cycles.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, iterative over an index of the nodes.
    let names: Vec<&String> = g.keys().collect();
    let index_of: BTreeMap<&String, usize> =
        names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let adj: Vec<Vec<usize>> = names
        .iter()
        .map(|n| {
            g[*n]
                .iter()
                .filter_map(|m| index_of.get(m).copied())
                .collect()
        })
        .collect();
    let n = names.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let mut on_stack = vec![false; n];
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut child)) = work.last_mut() {
            if *child == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = adj[v].get(*child) {
                *child += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(names[w].clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    out.push(comp);
                }
            }
        }
    }
    out.sort();
    out
}

/// Files outside the DDI modules whose code names the DDI mode.
fn ddi_leaks(sources: &[Source]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for s in sources {
        let stem = s.rel.trim_end_matches(".rs").trim_end_matches("/mod");
        if DDI_MODULES.contains(&stem) {
            continue;
        }
        let n = s
            .code
            .iter()
            .filter(|l| {
                l.contains("hawkbit::")
                    || l.contains("ddi::")
                    || l.contains("ServerKind::Hawkbit")
                    || l.contains(".ddi")
            })
            .count();
        if n > 0 {
            out.push((s.rel.clone(), n));
        }
    }
    out
}

/// What the rules found: files over the limit, and cycles.
struct Findings {
    too_long: Vec<(String, usize)>,
    cycles: Vec<Vec<String>>,
}

fn findings(sources: &[Source]) -> Findings {
    let mut too_long: Vec<(String, usize)> = sources
        .iter()
        .filter(|s| s.code.len() > MAX_CODE_LINES)
        .map(|s| (s.rel.clone(), s.code.len()))
        .collect();
    too_long.sort_by_key(|t| std::cmp::Reverse(t.1));
    Findings {
        too_long,
        cycles: cycles(&module_graph(sources)),
    }
}

fn agent_src() -> PathBuf {
    root().join("agent/src")
}

pub fn run(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        return Err("usage: cargo xtask layout".into());
    }
    let sources = agent_sources(&agent_src())?;
    let mut sizes: Vec<(usize, &str)> = sources
        .iter()
        .map(|s| (s.code.len(), s.rel.as_str()))
        .collect();
    sizes.sort_by(|a, b| b.cmp(a));
    println!(
        "agent: {} files, {} lines of code (limit {MAX_CODE_LINES} per file); the largest:",
        sources.len(),
        sources.iter().map(|s| s.code.len()).sum::<usize>()
    );
    for (n, rel) in sizes.iter().take(10) {
        println!("  {n:5}  {rel}");
    }
    let leaks = ddi_leaks(&sources);
    println!(
        "DDI mode named outside {}: {} lines in {} files",
        DDI_MODULES.join(", "),
        leaks.iter().map(|l| l.1).sum::<usize>(),
        leaks.len()
    );
    for (rel, n) in &leaks {
        println!("  {n:5}  {rel}");
    }
    let f = findings(&sources);
    for c in &f.cycles {
        println!("import cycle: {}", c.join(" ↔ "));
    }
    for (rel, n) in &f.too_long {
        println!("over the limit: {rel}: {n} lines of code");
    }
    if f.cycles.is_empty() && f.too_long.is_empty() {
        println!("layout: no import cycle, no file over {MAX_CODE_LINES} lines of code");
        Ok(())
    } else {
        Err("the agent's layout breaks its rules (above)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_has_no_import_cycle_and_no_file_over_the_limit() {
        let sources = agent_sources(&agent_src()).expect("reading agent/src");
        assert!(sources.len() > 40, "found only {} files", sources.len());
        let f = findings(&sources);
        assert!(
            f.cycles.is_empty(),
            "import cycles between the agent's modules: {:?}",
            f.cycles
        );
        assert!(
            f.too_long.is_empty(),
            "agent files over {MAX_CODE_LINES} lines of code (split them by concern): {:?}",
            f.too_long
        );
    }

    #[test]
    fn code_lines_leave_out_comments_blanks_and_the_test_module() {
        let text = "//! module doc\nuse crate::a;\n\n/// doc\nfn f() {} // crate::z\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n";
        let code = code_lines(text);
        assert_eq!(code, ["use crate::a;", "fn f() {}"]);
        assert_eq!(references(&code), BTreeSet::from(["a".to_string()]));
    }

    #[test]
    fn references_read_paths_and_use_groups() {
        let code: Vec<String> = [
            "use crate::{alpha, beta::{One, two::Three}, gamma::self};",
            "let x = crate::delta::f(crate::epsilon::G);",
            "let s = \"http://example\"; // crate::zeta",
        ]
        .map(String::from)
        .to_vec();
        let code: Vec<String> = code
            .iter()
            .map(|l| strip_trailing_comment(l).to_string())
            .collect();
        let names: Vec<String> = references(&code).into_iter().collect();
        assert_eq!(names, ["alpha", "beta", "delta", "epsilon", "gamma"]);
    }

    #[test]
    fn cycles_are_the_components_of_more_than_one_module() {
        let g: BTreeMap<String, BTreeSet<String>> = [
            ("a", vec!["b"]),
            ("b", vec!["c"]),
            ("c", vec!["a", "d"]),
            ("d", vec![]),
            ("e", vec!["d", "f"]),
            ("f", vec!["e"]),
            ("g", vec!["g"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
        .collect();
        assert_eq!(
            cycles(&g),
            vec![
                vec!["a".to_string(), "b".into(), "c".into()],
                vec!["e".to_string(), "f".into()],
            ]
        );
    }
}
