//! A strict reader for the subset of TOML that updraft's configuration uses.
//!
//! The configuration needs tables (`[server]`), keys with strings,
//! integers, booleans and arrays of those, and comments. A general TOML
//! library costs the device binary more than a hundred kilobytes for
//! features the configuration never uses, so this module reads exactly that
//! subset — and refuses everything else (floats, dates, inline tables,
//! multi-line strings, dotted keys, arrays of tables) with an error naming
//! the line, instead of guessing. What it accepts means what TOML says it
//! means, so a file that updraft reads is a valid TOML file.
//!
//! It only parses: which keys exist and what they must hold is
//! [`crate::config`]'s business.

use std::fmt;

/// A value in the subset.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(String),
    Integer(i64),
    Boolean(bool),
    Array(Vec<Value>),
}

impl Value {
    /// What kind of value this is, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "a string",
            Value::Integer(_) => "an integer",
            Value::Boolean(_) => "a boolean",
            Value::Array(_) => "an array",
        }
    }
}

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub value: Value,
    /// 1-based line of the key.
    pub line: usize,
}

/// A table: its name (empty for the top level), where it starts, and its
/// entries in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub name: String,
    pub line: usize,
    pub entries: Vec<Entry>,
}

/// A syntax error: the line and what is wrong there.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Parse a document into its tables (the top-level table first).
pub fn parse(text: &str) -> Result<Vec<Table>, SyntaxError> {
    Parser {
        chars: text.chars().collect(),
        pos: 0,
        line: 1,
    }
    .document()
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    line: usize,
}

type PResult<T> = Result<T, SyntaxError>;

fn is_bare_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl Parser {
    fn err<T>(&self, message: impl Into<String>) -> PResult<T> {
        Err(SyntaxError {
            line: self.line,
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Spaces and tabs.
    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.pos += 1;
        }
    }

    /// A comment up to (not including) the end of the line.
    fn skip_comment(&mut self) -> PResult<()> {
        if self.peek() == Some('#') {
            while let Some(c) = self.peek() {
                if c == '\n' {
                    break;
                }
                if c.is_control() && c != '\t' && c != '\r' {
                    return self.err("control character in a comment");
                }
                self.pos += 1;
            }
        }
        Ok(())
    }

    /// The end of a line: blanks, an optional comment, then a newline or
    /// the end of the text.
    fn end_of_line(&mut self) -> PResult<()> {
        self.skip_blanks();
        self.skip_comment()?;
        match self.peek() {
            None => Ok(()),
            Some('\n') => {
                self.bump();
                Ok(())
            }
            Some('\r') if self.chars.get(self.pos + 1) == Some(&'\n') => {
                self.pos += 1;
                self.bump();
                Ok(())
            }
            Some(c) => self.err(format!("unexpected {c:?} after the value")),
        }
    }

    /// Blanks, comments and newlines (inside arrays and between lines).
    fn skip_space(&mut self) -> PResult<()> {
        loop {
            self.skip_blanks();
            self.skip_comment()?;
            match self.peek() {
                Some('\n') => {
                    self.bump();
                }
                Some('\r') if self.chars.get(self.pos + 1) == Some(&'\n') => {
                    self.pos += 1;
                    self.bump();
                }
                _ => return Ok(()),
            }
        }
    }

    fn document(mut self) -> PResult<Vec<Table>> {
        let mut tables = vec![Table {
            name: String::new(),
            line: 1,
            entries: Vec::new(),
        }];
        loop {
            self.skip_space()?;
            match self.peek() {
                None => break,
                Some('[') => {
                    let line = self.line;
                    self.bump();
                    if self.peek() == Some('[') {
                        return self.err(
                            "arrays of tables ([[...]]) are not used by updraft's configuration",
                        );
                    }
                    self.skip_blanks();
                    let mut name = self.key()?;
                    self.skip_blanks();
                    // One level of dotted name: `[components.web]`.
                    if self.peek() == Some('.') {
                        self.bump();
                        self.skip_blanks();
                        name = format!("{name}.{}", self.key()?);
                        self.skip_blanks();
                        if self.peek() == Some('.') {
                            return self.err(
                                "tables nested deeper than [section.name] are not used by updraft's configuration",
                            );
                        }
                    }
                    if self.peek() != Some(']') {
                        return self.err(format!("table header [{name}] is not closed with ]"));
                    }
                    self.bump();
                    if tables.iter().any(|t| t.name == name) {
                        return self.err(format!("table [{name}] is defined twice"));
                    }
                    self.end_of_line()?;
                    tables.push(Table {
                        name,
                        line,
                        entries: Vec::new(),
                    });
                }
                Some(_) => {
                    let line = self.line;
                    let key = self.key()?;
                    self.skip_blanks();
                    if self.peek() == Some('.') {
                        return self.err(format!(
                            "dotted keys ({key}.…) are not used by updraft's configuration"
                        ));
                    }
                    if self.peek() != Some('=') {
                        return self.err(format!("expected = after the key {key}"));
                    }
                    self.bump();
                    self.skip_blanks();
                    let value = self.value()?;
                    self.end_of_line()?;
                    let table = tables
                        .last_mut()
                        .expect("the top-level table is always there");
                    if table.entries.iter().any(|e| e.key == key) {
                        return Err(SyntaxError {
                            line,
                            message: format!("key {key} is defined twice"),
                        });
                    }
                    table.entries.push(Entry { key, value, line });
                }
            }
        }
        Ok(tables)
    }

    fn key(&mut self) -> PResult<String> {
        match self.peek() {
            Some('"') => {
                self.bump();
                self.basic_string()
            }
            Some('\'') => {
                self.bump();
                self.literal_string()
            }
            Some(c) if is_bare_key_char(c) => {
                let mut k = String::new();
                while let Some(c) = self.peek() {
                    if !is_bare_key_char(c) {
                        break;
                    }
                    k.push(c);
                    self.pos += 1;
                }
                Ok(k)
            }
            Some(c) => self.err(format!("expected a key, found {c:?}")),
            None => self.err("expected a key, found the end of the file"),
        }
    }

    fn value(&mut self) -> PResult<Value> {
        match self.peek() {
            Some('"') => {
                if self.chars.get(self.pos + 1..self.pos + 3) == Some(&['"', '"'][..]) {
                    return self.err("multi-line strings are not used by updraft's configuration");
                }
                self.bump();
                self.basic_string().map(Value::String)
            }
            Some('\'') => {
                if self.chars.get(self.pos + 1..self.pos + 3) == Some(&['\'', '\''][..]) {
                    return self.err("multi-line strings are not used by updraft's configuration");
                }
                self.bump();
                self.literal_string().map(Value::String)
            }
            Some('[') => {
                self.bump();
                self.array()
            }
            Some('{') => self.err("inline tables are not used by updraft's configuration"),
            Some('t' | 'f') => {
                let word: String = self.chars[self.pos..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
                    .collect();
                match word.as_str() {
                    "true" => {
                        self.pos += 4;
                        Ok(Value::Boolean(true))
                    }
                    "false" => {
                        self.pos += 5;
                        Ok(Value::Boolean(false))
                    }
                    _ => self.err(format!(
                        "{word:?} is not a value (strings need quotes: \"{word}\")"
                    )),
                }
            }
            Some(c) if c.is_ascii_digit() || c == '+' || c == '-' => self.integer(),
            Some(c) => self.err(format!(
                "{c:?} does not start a value (strings need quotes)"
            )),
            None => self.err("a value is missing at the end of the file"),
        }
    }

    fn integer(&mut self) -> PResult<Value> {
        let start = self.pos;
        let mut text = String::new();
        if let Some(c @ ('+' | '-')) = self.peek() {
            text.push(c);
            self.pos += 1;
        }
        let mut prev_underscore = true;
        while let Some(c) = self.peek() {
            if c.is_ascii_digit() {
                text.push(c);
                prev_underscore = false;
            } else if c == '_' && !prev_underscore {
                prev_underscore = true;
            } else {
                break;
            }
            self.pos += 1;
        }
        if matches!(
            self.peek(),
            Some('.' | 'e' | 'E' | ':' | 'x' | 'o' | 'b' | 'T' | '-' | '+')
        ) {
            let seen: String = self.chars[start..]
                .iter()
                .take_while(|c| !c.is_whitespace())
                .collect();
            return self.err(format!(
                "{seen} is not a decimal integer (floats, dates and hex are not used by updraft's configuration)"
            ));
        }
        let digits = text.trim_start_matches(['+', '-']);
        if digits.is_empty() || prev_underscore {
            return self.err(format!("{text:?} is not an integer"));
        }
        if digits.len() > 1 && digits.starts_with('0') {
            return self.err(format!(
                "{text} has a leading zero, which TOML does not allow"
            ));
        }
        text.parse::<i64>()
            .map(Value::Integer)
            .or_else(|_| self.err(format!("{text} does not fit in a 64-bit integer")))
    }

    fn basic_string(&mut self) -> PResult<String> {
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return self.err("string is not closed with \""),
                Some('"') => {
                    self.pos += 1;
                    return Ok(s);
                }
                Some('\\') => {
                    self.pos += 1;
                    let c = self.peek();
                    self.pos += 1;
                    match c {
                        Some('"') => s.push('"'),
                        Some('\\') => s.push('\\'),
                        Some('b') => s.push('\u{8}'),
                        Some('t') => s.push('\t'),
                        Some('n') => s.push('\n'),
                        Some('f') => s.push('\u{c}'),
                        Some('r') => s.push('\r'),
                        Some(u @ ('u' | 'U')) => {
                            let n = if u == 'u' { 4 } else { 8 };
                            let hex: String = self.chars.iter().skip(self.pos).take(n).collect();
                            let code = (hex.len() == n)
                                .then(|| u32::from_str_radix(&hex, 16).ok())
                                .flatten()
                                .and_then(char::from_u32);
                            match code {
                                Some(ch) => {
                                    s.push(ch);
                                    self.pos += n;
                                }
                                None => {
                                    return self.err(format!(
                                        "\\{u}{hex} is not a valid character escape"
                                    ));
                                }
                            }
                        }
                        Some(c) => return self.err(format!("\\{c} is not a valid escape")),
                        None => return self.err("string is not closed with \""),
                    }
                }
                Some(c) if c.is_control() && c != '\t' => {
                    return self.err("control character in a string (escape it)");
                }
                Some(c) => {
                    s.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn literal_string(&mut self) -> PResult<String> {
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return self.err("string is not closed with '"),
                Some('\'') => {
                    self.pos += 1;
                    return Ok(s);
                }
                Some(c) if c.is_control() && c != '\t' => {
                    return self.err("control character in a string");
                }
                Some(c) => {
                    s.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn array(&mut self) -> PResult<Value> {
        let mut items = Vec::new();
        loop {
            self.skip_space()?;
            if self.peek() == Some(']') {
                self.pos += 1;
                return Ok(Value::Array(items));
            }
            items.push(self.value()?);
            self.skip_space()?;
            match self.peek() {
                Some(',') => {
                    self.pos += 1;
                }
                Some(']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                Some(c) => return self.err(format!("expected , or ] in an array, found {c:?}")),
                None => return self.err("array is not closed with ]"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_subset() {
        let t = parse(
            "# updraft\ntop = 1\n[server]\nmanifest_url = \"https://h/m.json\" # trailing\nmirrors = [\n  \"a\",\n  'b', # literal\n]\nflag = true\nn = -1_000\n\n[slots]\na = '/dev/mmcblk0p2'\nesc = \"tab\\there \\u00e9\"\n",
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].entries[0].value, Value::Integer(1));
        assert_eq!(t[1].name, "server");
        assert_eq!(
            t[1].entries[0].value,
            Value::String("https://h/m.json".into())
        );
        assert_eq!(
            t[1].entries[1].value,
            Value::Array(vec![Value::String("a".into()), Value::String("b".into())])
        );
        assert_eq!(t[1].entries[1].line, 5);
        assert_eq!(t[1].entries[2].value, Value::Boolean(true));
        assert_eq!(t[1].entries[3].value, Value::Integer(-1000));
        assert_eq!(t[2].entries[1].value, Value::String("tab\there é".into()));
    }

    #[test]
    fn refuses_what_it_does_not_read() {
        for (text, line, what) in [
            ("a = 1.5\n", 1, "not a decimal integer"),
            ("a = 1979-05-27T07:32:00Z\n", 1, "not a decimal integer"),
            ("a = {x = 1}\n", 1, "inline tables"),
            ("a = \"\"\"x\"\"\"\n", 1, "multi-line strings"),
            ("a.b = 1\n", 1, "dotted keys"),
            ("[[t]]\n", 1, "arrays of tables"),
            ("[a.b.c]\n", 1, "nested deeper"),
            ("[s]\n[s]\n", 2, "defined twice"),
            ("a = 1\na = 2\n", 2, "defined twice"),
            ("a = \"open\n", 1, "not closed"),
            ("a = yes\n", 1, "does not start a value"),
            ("a = tru\n", 1, "is not a value"),
            ("a = 1 2\n", 1, "after the value"),
            ("a = 012\n", 1, "leading zero"),
            ("a = 1_\n", 1, "not an integer"),
            ("a = [1, 2\n", 2, "not closed"),
            ("a = \"\\q\"\n", 1, "not a valid escape"),
            ("a = 99999999999999999999\n", 1, "64-bit"),
            ("[s\n", 1, "not closed"),
            ("= 1\n", 1, "expected a key"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn never_panics_on_garbage() {
        let samples = [
            "",
            "[",
            "\"",
            "a=",
            "a=[",
            "a=\"\\u",
            "a=\"\\uD800\"",
            "\u{0}",
            "a=-",
            "a=+_1",
            "[]",
            "a=[,]",
        ];
        for s in samples {
            let _ = parse(s);
        }
        let mut x: u32 = 7;
        for _ in 0..2000 {
            let text: String = (0..40)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let alphabet = b"ab=[]\"'#\n ,.\\u0123tf-_{}";
                    alphabet[(x as usize) % alphabet.len()] as char
                })
                .collect();
            let _ = parse(&text);
        }
    }
}
