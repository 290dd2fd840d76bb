//! The check that no error's message repeats its cause: an `#[error("...")]` (thiserror) whose
//! format string names the field that is the error's source (`#[source]`, `#[from]`, or a
//! field called `source`), by name (`{source}`) or position (`{0}`), or through an extra
//! argument (`"{}", .source`). Such a message says the cause twice when printed with its
//! chain (`error_chain`, anyhow's `{:#}`); the message says what failed and the source why.
//!
//! `#[error(transparent)]` is not a message and passes, and so do the items of [`ALLOWED`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// `(file, item, why)`: messages that print their source on purpose.
pub const ALLOWED: [(&str, &str, &str); 1] = [(
    "jumpstarter-cli/src/hints.rs",
    "WithHint",
    "prints its whole cause and then, on a line of its own, what to do about it; jmp's \
     format_error skips the causes it already printed",
)];

/// One message that repeats its source.
#[derive(Debug, PartialEq, Eq)]
pub struct Repeat {
    /// The file, as given.
    pub file: String,
    /// The line of the `#[error]` attribute.
    pub line: usize,
    /// `Enum::Variant` or `Struct`.
    pub item: String,
    /// The format string.
    pub message: String,
}

impl std::fmt::Display for Repeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {} repeats its source in its message {:?}",
            self.file, self.line, self.item, self.message
        )
    }
}

/// The messages that repeat their source in every `.rs` file under `dirs` (`target` and
/// hidden folders skipped), with paths relative to `root`.
pub fn repeats_in(root: &Path, dirs: &[&str]) -> Result<Vec<Repeat>> {
    let mut files = Vec::new();
    for d in dirs {
        rs_files(&root.join(d), &mut files)?;
    }
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let name = f.strip_prefix(root).unwrap_or(&f).display().to_string();
        let found = repeats_in_source(&name, &text).with_context(|| format!("parsing {name}"))?;
        out.extend(
            found
                .into_iter()
                .filter(|r| !ALLOWED.iter().any(|(f, i, _)| *f == r.file && *i == r.item)),
        );
    }
    Ok(out)
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        let kind = entry
            .file_type()
            .with_context(|| format!("reading {}", path.display()))?;
        if kind.is_dir() {
            rs_files(&path, out)?;
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The messages that repeat their source in one file's text (`file` names it in the result).
pub fn repeats_in_source(file: &str, text: &str) -> Result<Vec<Repeat>> {
    let ast = syn::parse_file(text)?;
    let mut v = Finder {
        file,
        out: Vec::new(),
    };
    v.visit_file(&ast);
    Ok(v.out)
}

struct Finder<'a> {
    file: &'a str,
    out: Vec<Repeat>,
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_enum(&mut self, e: &'ast syn::ItemEnum) {
        for v in &e.variants {
            self.check(
                &format!("{}::{}", e.ident, v.ident),
                &v.attrs,
                &v.fields,
                Some(&e.attrs),
            );
        }
        syn::visit::visit_item_enum(self, e);
    }

    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        self.check(&s.ident.to_string(), &s.attrs, &s.fields, None);
        syn::visit::visit_item_struct(self, s);
    }
}

impl Finder<'_> {
    /// Checks the `#[error]` of one variant (or of the enum, when the variant has none) or
    /// struct against its fields.
    fn check(
        &mut self,
        item: &str,
        attrs: &[syn::Attribute],
        fields: &syn::Fields,
        enum_attrs: Option<&[syn::Attribute]>,
    ) {
        let attr = attrs
            .iter()
            .chain(enum_attrs.unwrap_or_default())
            .find(|a| a.path().is_ident("error"));
        let Some(attr) = attr else { return };
        let Ok(list) = attr.meta.require_list() else {
            return;
        };
        let Some(source) = source_member(fields) else {
            return;
        };
        let tokens: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
        let Some(TokenTree::Literal(lit)) = tokens.first() else {
            return; // transparent, or not a message
        };
        let Ok(syn::Lit::Str(message)) = syn::parse_str::<syn::Lit>(&lit.to_string()) else {
            return;
        };
        let message = message.value();
        let rest: TokenStream = tokens[1..].iter().cloned().collect();
        let named_in_message = placeholders(&message).contains(&source);
        if named_in_message || names_member(rest, &source) {
            self.out.push(Repeat {
                file: self.file.to_owned(),
                line: attr.pound_token.span.start().line,
                item: item.to_owned(),
                message,
            });
        }
    }
}

/// The source field of a struct or variant, as a format argument names it (`source`, `0`):
/// the field marked `#[source]` or `#[from]`, else a named field called `source`.
fn source_member(fields: &syn::Fields) -> Option<String> {
    let member = |i: usize, f: &syn::Field| match &f.ident {
        Some(id) => id.to_string(),
        None => i.to_string(),
    };
    let marked = fields.iter().enumerate().find(|(_, f)| {
        f.attrs
            .iter()
            .any(|a| a.path().is_ident("source") || a.path().is_ident("from"))
    });
    if let Some((i, f)) = marked {
        return Some(member(i, f));
    }
    fields
        .iter()
        .find(|f| f.ident.as_ref().is_some_and(|id| id == "source"))
        .map(|_| "source".to_owned())
}

/// The argument names of a format string's placeholders (`{source}`, `{0:?}`, `{}` gives "").
fn placeholders(message: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = message.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '{' => {
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    inner.push(c);
                }
                let name = inner.split(':').next().unwrap_or_default().trim();
                out.push(name.to_owned());
            }
            _ => {}
        }
    }
    out
}

/// Whether the extra format arguments refer to the field `member` (`.source`, `.0`, or a
/// named field by its bare name, `reason(source)`).
fn names_member(tokens: TokenStream, member: &str) -> bool {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    tokens.iter().enumerate().any(|(i, t)| match t {
        TokenTree::Group(g) => names_member(g.stream(), member),
        TokenTree::Ident(id) => {
            let after_dot = matches!(
                i.checked_sub(1).and_then(|j| tokens.get(j)),
                Some(TokenTree::Punct(p)) if p.as_char() == '.'
            );
            !after_dot && id == member
        }
        TokenTree::Punct(p) if p.as_char() == '.' => {
            // `.source`, or `.` and the literal `0` (`0.` before a method call).
            let prev_is_value = matches!(
                i.checked_sub(1).and_then(|j| tokens.get(j)),
                Some(TokenTree::Ident(_) | TokenTree::Literal(_) | TokenTree::Group(_))
            );
            !prev_is_value
                && match tokens.get(i + 1) {
                    Some(TokenTree::Ident(id)) => id == member,
                    Some(TokenTree::Literal(l)) => l.to_string().split('.').next() == Some(member),
                    _ => false,
                }
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Vec<(usize, String)> {
        repeats_in_source("x.rs", text)
            .unwrap()
            .into_iter()
            .map(|r| (r.line, r.item))
            .collect()
    }

    #[test]
    fn messages_that_name_their_source_are_found_with_their_line() {
        let text = r#"
#[derive(Debug, thiserror::Error)]
pub enum E {
    #[error("reading {path}: {source}")]
    Read { path: String, #[source] source: std::io::Error },
    #[error("parsing: {0}")]
    Parse(#[from] std::num::ParseIntError),
    #[error("listening on {addr}: {source:?}")]
    Listen { addr: String, source: std::io::Error },
    #[error("tls {0}: {1}")]
    Tls(String, #[source] std::io::Error),
    #[error("decoding: {}", .cause)]
    Decode { #[from] cause: std::io::Error },
    #[error("{context}: {source}")]
    Because { context: String, source: std::io::Error },
    #[error("cannot reach {endpoint}: {}", reason(source))]
    Router { endpoint: String, source: std::io::Error },
}
mod inner {
    fn f() {
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped: {0}")]
        struct W(#[source] std::io::Error);
    }
}
"#;
        assert_eq!(
            found(text),
            vec![
                (4, "E::Read".to_owned()),
                (6, "E::Parse".to_owned()),
                (8, "E::Listen".to_owned()),
                (10, "E::Tls".to_owned()),
                (12, "E::Decode".to_owned()),
                (14, "E::Because".to_owned()),
                (16, "E::Router".to_owned()),
                (22, "W".to_owned()),
            ]
        );
    }

    #[test]
    fn messages_that_name_what_failed_and_leave_the_cause_to_the_chain_pass() {
        let text = r#"
#[derive(Debug, thiserror::Error)]
pub enum E {
    #[error("reading {path}")]
    Read { path: String, #[source] source: std::io::Error },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("bad value {0}")]
    Bad(String),
    #[error("tls {0} {{0}} {1:?}")]
    Tls(String, u32, #[source] std::io::Error),
    #[error("at {}", .path.display())]
    At { path: std::path::PathBuf, #[source] source: std::io::Error },
    #[error("at {}", show(path))]
    Shown { path: String, #[source] cause: std::io::Error },
    #[error("{0}")]
    Message(String),
}
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub struct Because { context: String, #[source] cause: std::io::Error }
"#;
        assert_eq!(found(text), vec![]);
    }

    #[test]
    fn files_are_read_under_each_crate_and_named_from_the_root() {
        let root = tempfile::tempdir().unwrap();
        let bad = "#[derive(Debug, thiserror::Error)]\n\
                   #[error(\"cannot open {path}: {source}\")]\n\
                   pub struct Open { path: String, source: std::io::Error }\n";
        for (path, text) in [
            ("a/src/lib.rs", "pub mod m;\n"),
            ("a/src/m/open.rs", bad),
            ("a/tests/it/main.rs", bad),
            ("a/target/debug/gen.rs", bad),
            ("b/src/lib.rs", bad),
        ] {
            let p = root.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let found: Vec<String> = repeats_in(root.path(), &["a"])
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "a/src/m/open.rs:2: Open repeats its source in its message \"cannot open {path}: {source}\"",
                "a/tests/it/main.rs:2: Open repeats its source in its message \"cannot open {path}: {source}\"",
            ]
        );
    }
}
