//! `cargo xtask arch`: the architecture checks `cargo xtask ci` runs.
//!
//! 1. **No file-level import cycles inside a crate.** Every `src/**/*.rs` file of each crate is
//!    a node; every reference from one file to an item of another is an edge: `use` trees and
//!    paths in code or in macro arguments that start with `crate::`, `super::`, `self::`, the
//!    crate's own name, a child module or a name a `use` brought in. Paths are followed
//!    through re-exports to the file that defines the item, so a `pub use` facade cannot hide
//!    a cycle. The rules for a folder (`foo/mod.rs` or `foo.rs` with children `foo/*.rs`):
//!    - a re-export of a descendant's items (`pub use child::Item`, any `pub(..)`) is the
//!      folder's facade and is not an edge;
//!    - a child may use its parent's items (`super::Item`): that is an edge child -> parent;
//!    - so a parent's own code may not use a child that uses the parent, and siblings may
//!      not form cycles, as any other files.
//!
//!    `#[cfg(test)]` items (unit-test modules) are not part of the graph. Binaries under
//!    `src/bin` are crates of their own and are not read.
//! 2. **The controller builds without the compression libraries**: `cargo tree -p
//!    jumpstarter-controller -e normal` names no zstd, lzma/xz or bzip2 crate.
//! 3. **No error message repeats its cause**: no `#[error("...")]` in these crates' files
//!    names its own source field (see [`crate::arch_errors`]); the message says what failed,
//!    the source why, and printers walk the chain.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The crates whose files must not form import cycles.
const CRATES: [&str; 11] = [
    "jumpstarter-proto",
    "jumpstarter-macros",
    "jumpstarter-core",
    "jumpstarter-drivers",
    "jumpstarter-exporter",
    "jumpstarter-router",
    "jumpstarter-controller",
    "jumpstarter-cli",
    "examples/custom-driver",
    "examples/lab-harness",
    "xtask",
];

/// Crate names (prefixes) the controller must not depend on.
const COMPRESSION_CRATES: [&str; 8] = [
    "async-compression",
    "compression-codecs",
    "compression-core",
    "zstd",
    "lzma",
    "liblzma",
    "xz2",
    "bzip2",
];

/// Runs the checks, naming every cycle, every unwanted crate and every repeated cause.
pub fn run() -> Result<()> {
    let root = crate::workspace_root();
    let mut failures = Vec::new();
    for name in CRATES {
        let graph = FileGraph::read_crate(&root.join(name))
            .with_context(|| format!("reading the modules of {name}"))?;
        let cycles = graph.cycles();
        if cycles.is_empty() {
            println!(
                "arch: {name}: {} files, no import cycles",
                graph.files.len()
            );
        }
        for cycle in cycles {
            failures.push(format!("{name}: import cycle {}", cycle.join(" -> ")));
        }
    }
    let found = controller_compression_crates(&root)?;
    if found.is_empty() {
        println!("arch: jumpstarter-controller builds without compression libraries");
    } else {
        failures.push(format!(
            "jumpstarter-controller depends on compression libraries: {}",
            found.join(", ")
        ));
    }
    let repeats = crate::arch_errors::repeats_in(&root, &CRATES)?;
    if repeats.is_empty() {
        println!("arch: no error message repeats its source");
    }
    failures.extend(repeats.iter().map(ToString::to_string));
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("arch: {f}");
        }
        bail!("{} architecture check(s) failed", failures.len());
    }
    Ok(())
}

/// The compression crates in `cargo tree -p jumpstarter-controller -e normal`.
fn controller_compression_crates(root: &Path) -> Result<Vec<String>> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "tree",
            "-p",
            "jumpstarter-controller",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-f",
            "{p}",
        ])
        .current_dir(root)
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree -p jumpstarter-controller failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(compression_crates_in(&String::from_utf8_lossy(&out.stdout)))
}

/// The package names of `tree` (one `name vX.Y.Z ...` a line) that are compression crates.
fn compression_crates_in(tree: &str) -> Vec<String> {
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| {
            COMPRESSION_CRATES
                .iter()
                .any(|c| *name == *c || name.starts_with(&format!("{c}-")))
        })
        .collect();
    names.into_iter().map(str::to_owned).collect()
}

/// A module: a file, or an inline `mod name { ... }` inside one.
#[derive(Debug, Default)]
struct Module {
    file: usize,
    parent: Option<usize>,
    children: HashMap<String, usize>,
    /// Names of the items defined here (fn, struct, enum, const, trait, ...).
    items: BTreeSet<String>,
    /// `use` declarations: the name they bring in and the path it stands for.
    uses: HashMap<String, Vec<String>>,
    /// `use path::*` declarations.
    globs: Vec<Vec<String>>,
    /// Paths this module refers to, and whether each is a re-export (`pub use`).
    refs: Vec<(Vec<String>, bool)>,
}

/// The files of one crate and the references between them.
pub struct FileGraph {
    /// Paths relative to the crate's `src`.
    pub files: Vec<String>,
    /// `from -> {to}` (indices into `files`).
    pub edges: BTreeMap<usize, BTreeSet<usize>>,
}

impl FileGraph {
    /// Reads the crate at `dir` from `src/lib.rs` (or `src/main.rs`) through its `mod` items.
    pub fn read_crate(dir: &Path) -> Result<Self> {
        let src = dir.join("src");
        let root = ["lib.rs", "main.rs"]
            .into_iter()
            .map(|f| src.join(f))
            .find(|p| p.exists())
            .with_context(|| format!("{} has no src/lib.rs or src/main.rs", dir.display()))?;
        let own_name = dir
            .file_name()
            .map(|n| n.to_string_lossy().replace('-', "_"))
            .unwrap_or_default();
        let mut reader = Reader {
            src,
            files: Vec::new(),
            modules: Vec::new(),
        };
        reader.read_file(&root, None, None)?;
        Ok(reader.graph(&own_name))
    }

    /// Builds a graph from named edges.
    #[cfg(test)]
    pub fn from_edges(edges: &[(&str, &str)]) -> Self {
        fn index(name: &str, files: &mut Vec<String>) -> usize {
            match files.iter().position(|f| f == name) {
                Some(i) => i,
                None => {
                    files.push(name.to_owned());
                    files.len() - 1
                }
            }
        }
        let mut files: Vec<String> = Vec::new();
        let mut map: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for (a, b) in edges {
            let a = index(a, &mut files);
            let b = index(b, &mut files);
            map.entry(a).or_default().insert(b);
        }
        FileGraph { files, edges: map }
    }

    /// One cycle (as file names, the first repeated at the end) per strongly connected set
    /// of files larger than one.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let n = self.files.len();
        let components = strongly_connected(n, &self.edges);
        let mut out = Vec::new();
        for comp in components.into_iter().filter(|c| c.len() > 1) {
            let set: BTreeSet<usize> = comp.iter().copied().collect();
            if let Some(cycle) = self.cycle_within(&set) {
                out.push(cycle.into_iter().map(|i| self.files[i].clone()).collect());
            }
        }
        out
    }

    /// A shortest cycle through the smallest file of `set`, by breadth-first search.
    fn cycle_within(&self, set: &BTreeSet<usize>) -> Option<Vec<usize>> {
        let start = *set.iter().next()?;
        let mut prev: HashMap<usize, usize> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            for &next in self.edges.get(&node).into_iter().flatten() {
                if !set.contains(&next) {
                    continue;
                }
                if next == start {
                    let mut path = vec![start];
                    let mut at = node;
                    while at != start {
                        path.push(at);
                        at = *prev.get(&at)?;
                    }
                    path.push(start);
                    path.reverse();
                    return Some(path);
                }
                if next != start && !prev.contains_key(&next) {
                    prev.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// Tarjan's algorithm, iteratively: the strongly connected components of the graph.
fn strongly_connected(n: usize, edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut out = Vec::new();
    let succ = |v: usize| -> Vec<usize> {
        edges
            .get(&v)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    };
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, successors, position in successors)
        let mut work: Vec<(usize, Vec<usize>, usize)> = vec![(root, succ(root), 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some((v, ws, i)) = work.last_mut() {
            let v = *v;
            if let Some(&w) = ws.get(*i) {
                *i += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, succ(w), 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some((parent, _, _)) = work.last() {
                low[*parent] = low[*parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

/// Reads files and their modules.
struct Reader {
    src: PathBuf,
    files: Vec<String>,
    modules: Vec<Module>,
}

impl Reader {
    /// Reads `path` as the module `name` under `parent`; returns the module's index.
    fn read_file(
        &mut self,
        path: &Path,
        parent: Option<usize>,
        name: Option<&str>,
    ) -> Result<usize> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
        let rel = path
            .strip_prefix(&self.src)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        self.files.push(rel);
        let file_index = self.files.len() - 1;
        let module = self.new_module(file_index, parent, name);
        // Where `mod child;` of this file looks for `child.rs` / `child/mod.rs`.
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let child_dir = match stem.as_deref() {
            Some("mod" | "lib" | "main") | None => dir.clone(),
            Some(stem) => dir.join(stem),
        };
        // `#[path]` of a file's own `mod` items is relative to the file's directory.
        self.read_items(&file.items, module, &child_dir, &dir)?;
        Ok(module)
    }

    fn new_module(&mut self, file: usize, parent: Option<usize>, name: Option<&str>) -> usize {
        self.modules.push(Module {
            file,
            parent,
            ..Module::default()
        });
        let index = self.modules.len() - 1;
        if let (Some(p), Some(name)) = (parent, name) {
            self.modules[p].children.insert(name.to_owned(), index);
        }
        index
    }

    fn read_items(
        &mut self,
        items: &[syn::Item],
        module: usize,
        child_dir: &Path,
        path_dir: &Path,
    ) -> Result<()> {
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    match &m.content {
                        Some((_, inner)) => {
                            let file = self.modules[module].file;
                            let child = self.new_module(file, Some(module), Some(&name));
                            let dir = child_dir.join(&name);
                            self.read_items(inner, child, &dir, &dir)?;
                        }
                        None => {
                            let path = match path_attr(&m.attrs) {
                                Some(p) => path_dir.join(p),
                                None => {
                                    let flat = child_dir.join(format!("{name}.rs"));
                                    if flat.exists() {
                                        flat
                                    } else {
                                        child_dir.join(&name).join("mod.rs")
                                    }
                                }
                            };
                            self.read_file(&path, Some(module), Some(&name))?;
                        }
                    }
                }
                syn::Item::Use(u) => {
                    let public = !matches!(u.vis, syn::Visibility::Inherited);
                    let mut flat = Vec::new();
                    flatten_use(&u.tree, &mut Vec::new(), &mut flat);
                    let m = &mut self.modules[module];
                    for (path, alias) in flat {
                        match alias {
                            Some(alias) => {
                                if alias != "_" {
                                    m.uses.insert(alias, path.clone());
                                }
                            }
                            None => m.globs.push(path.clone()),
                        }
                        m.refs.push((path, public));
                    }
                }
                other => {
                    if let Some(name) = item_name(other) {
                        self.modules[module].items.insert(name);
                    }
                    let mut paths = PathCollector::default();
                    paths.visit_item(other);
                    self.modules[module]
                        .refs
                        .extend(paths.paths.into_iter().map(|p| (p, false)));
                }
            }
        }
        Ok(())
    }

    /// Resolves every reference and keeps the edges between different files.
    fn graph(self, own_name: &str) -> FileGraph {
        let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for (id, module) in self.modules.iter().enumerate() {
            for (path, public) in &module.refs {
                let Some(target) = self.resolve(id, path, own_name, 0) else {
                    continue;
                };
                let to = self.modules[target].file;
                if to == module.file {
                    continue;
                }
                if *public && self.is_descendant(target, id) {
                    continue;
                }
                if std::env::var_os("ARCH_DEBUG").is_some() {
                    eprintln!(
                        "{} -> {}: {}",
                        self.files[module.file],
                        self.files[to],
                        path.join("::")
                    );
                }
                edges.entry(module.file).or_default().insert(to);
            }
        }
        FileGraph {
            files: self.files,
            edges,
        }
    }

    fn is_descendant(&self, mut module: usize, ancestor: usize) -> bool {
        while let Some(parent) = self.modules[module].parent {
            if parent == ancestor {
                return true;
            }
            module = parent;
        }
        false
    }

    /// The module that defines what `path` (as written in `from`) names; `None` for paths
    /// outside the crate.
    fn resolve(&self, from: usize, path: &[String], own_name: &str, depth: usize) -> Option<usize> {
        if depth > 16 {
            return None;
        }
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" => 0,
            "self" => from,
            "super" => self.modules[from].parent?,
            name if name == own_name => 0,
            name => {
                let m = &self.modules[from];
                if let Some(&child) = m.children.get(name) {
                    child
                } else if let Some(target) = m.uses.get(name) {
                    let resolved = self.resolve(from, target, own_name, depth + 1)?;
                    if rest.is_empty() {
                        return Some(resolved);
                    }
                    return self.walk(resolved, rest, own_name, depth);
                } else {
                    return None;
                }
            }
        };
        let mut rest = rest;
        // `super::super::...`
        while rest.first().map(String::as_str) == Some("super") {
            at = self.modules[at].parent?;
            rest = &rest[1..];
        }
        self.walk(at, rest, own_name, depth)
    }

    /// Follows `rest` from the module `at`.
    fn walk(&self, mut at: usize, rest: &[String], own_name: &str, depth: usize) -> Option<usize> {
        for seg in rest {
            let m = &self.modules[at];
            if let Some(&child) = m.children.get(seg) {
                at = child;
            } else if m.items.contains(seg) {
                return Some(at);
            } else if let Some(target) = m.uses.get(seg) {
                return self.resolve(at, target, own_name, depth + 1);
            } else {
                for glob in &m.globs {
                    if let Some(g) = self.resolve(at, glob, own_name, depth + 1) {
                        let gm = &self.modules[g];
                        if gm.children.contains_key(seg)
                            || gm.items.contains(seg)
                            || gm.uses.contains_key(seg)
                        {
                            return self.walk(g, std::slice::from_ref(seg), own_name, depth + 1);
                        }
                    }
                }
                return Some(at);
            }
        }
        Some(at)
    }
}

/// `use` trees as flat `(path, Some(name it binds))` or `(path, None)` for globs.
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last() {
                    out.push((prefix.clone(), Some(last.clone())));
                }
            } else {
                let mut path = prefix.clone();
                path.push(name.clone());
                out.push((path, Some(name)));
            }
        }
        syn::UseTree::Rename(r) => {
            let name = r.ident.to_string();
            let path = if name == "self" {
                prefix.clone()
            } else {
                let mut p = prefix.clone();
                p.push(name);
                p
            };
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

/// Collects the paths of an item's code, including those in macro arguments.
#[derive(Default)]
struct PathCollector {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for PathCollector {
    /// `pub(crate)`, `pub(super)`, `pub(in path)` name no item.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        // `::name::...` is an external crate.
        if p.leading_colon.is_none() {
            self.paths.push(segs);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        paths_in_tokens(m.tokens.clone(), &mut self.paths);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut flat = Vec::new();
        flatten_use(&u.tree, &mut Vec::new(), &mut flat);
        self.paths.extend(flat.into_iter().map(|(p, _)| p));
    }
}

/// `a::b::c` sequences in a macro's tokens (macro arguments are not parsed as Rust).
fn paths_in_tokens(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => {
                paths_in_tokens(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(first) => {
                let preceded_by_colons =
                    i >= 1 && matches!(&tokens[i - 1], TokenTree::Punct(p) if p.as_char() == ':');
                let mut path = vec![first.to_string()];
                let mut j = i + 1;
                loop {
                    let colons = matches!((tokens.get(j), tokens.get(j + 1)),
                        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                            if a.as_char() == ':' && b.as_char() == ':');
                    match (colons, tokens.get(j + 2)) {
                        (true, Some(TokenTree::Ident(next))) => {
                            path.push(next.to_string());
                            j += 3;
                        }
                        _ => break,
                    }
                }
                if path.len() > 1 && !preceded_by_colons {
                    out.push(path);
                }
                i = j;
            }
            TokenTree::Punct(_) | TokenTree::Literal(_) => i += 1,
        }
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// `#[cfg(test)]` (also inside `all(...)`): compiled for unit tests only.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let text = a
                .meta
                .require_list()
                .map(|l| l.tokens.to_string())
                .unwrap_or_default();
            text == "test"
                || (text.starts_with("all") && text.contains("test") && !text.contains("not"))
        }
    })
}

/// The `#[path = "..."]` of a `mod` item.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_is_found_and_named() {
        let g = FileGraph::from_edges(&[
            ("lib.rs", "a.rs"),
            ("a.rs", "b.rs"),
            ("b.rs", "c.rs"),
            ("c.rs", "a.rs"),
            ("c.rs", "d.rs"),
        ]);
        let cycles = g.cycles();
        assert_eq!(cycles, vec![vec!["a.rs", "b.rs", "c.rs", "a.rs"]]);
    }

    #[test]
    fn a_graph_without_cycles_passes() {
        let g = FileGraph::from_edges(&[
            ("lib.rs", "a.rs"),
            ("lib.rs", "b.rs"),
            ("a.rs", "b.rs"),
            ("b.rs", "c.rs"),
            ("a.rs", "c.rs"),
        ]);
        assert!(g.cycles().is_empty());
    }

    /// Writes a crate's `src` files into a temporary directory.
    fn crate_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join("src").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn sibling_files_that_use_each_other_are_a_cycle() {
        let dir = crate_with(&[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub struct A;\nfn f() -> crate::b::B { todo!() }\n"),
            ("b.rs", "use crate::a::A;\npub struct B(A);\n"),
        ]);
        let g = FileGraph::read_crate(dir.path()).unwrap();
        assert_eq!(g.cycles(), vec![vec!["a.rs", "b.rs", "a.rs"]]);
    }

    #[test]
    fn a_cycle_through_a_re_export_or_a_macro_is_found() {
        let dir = crate_with(&[
            ("lib.rs", "mod x;\npub use x::X;\nmod y;\n"),
            ("x/mod.rs", "mod inner;\npub use inner::X;\n"),
            (
                "x/inner.rs",
                "pub struct X;\nfn f() { println!(\"{}\", crate::y::Y); }\n",
            ),
            ("y.rs", "pub const Y: u8 = 0;\nfn g(_: crate::X) {}\n"),
        ]);
        let g = FileGraph::read_crate(dir.path()).unwrap();
        assert_eq!(g.cycles(), vec![vec!["x/inner.rs", "y.rs", "x/inner.rs"]]);
    }

    #[test]
    fn facades_children_using_parents_and_tests_are_not_cycles() {
        let dir = crate_with(&[
            ("lib.rs", "pub mod cfg;\n"),
            (
                "cfg/mod.rs",
                "mod client;\nmod exporter;\npub use client::C;\npub use exporter::E;\n\
                 pub struct Shared;\n#[cfg(test)]\nmod tests { use super::client::C; }\n",
            ),
            (
                "cfg/client.rs",
                "use super::Shared;\npub struct C(Shared);\n",
            ),
            (
                "cfg/exporter.rs",
                "pub struct E(super::Shared, crate::cfg::C);\n",
            ),
        ]);
        let g = FileGraph::read_crate(dir.path()).unwrap();
        assert!(g.cycles().is_empty(), "{:?}", g.cycles());
        // ...but a parent whose own code uses a child that uses it back is one.
        let dir = crate_with(&[
            ("lib.rs", "mod p;\n"),
            ("p/mod.rs", "mod c;\npub struct Shared;\nfn f(_: c::C) {}\n"),
            ("p/c.rs", "pub struct C(super::Shared);\n"),
        ]);
        let g = FileGraph::read_crate(dir.path()).unwrap();
        assert_eq!(g.cycles(), vec![vec!["p/mod.rs", "p/c.rs", "p/mod.rs"]]);
    }

    #[test]
    fn compression_crates_are_recognised_in_cargo_tree_output() {
        let tree = "jumpstarter-controller v0.1.0 (/w)\nzstd-sys v2.0.15+zstd.1.5.7\n\
                    tokio v1.0.0\nliblzma-sys v0.4.4\nzstd v0.13.3\nserde v1.0.0\n";
        assert_eq!(
            compression_crates_in(tree),
            vec!["liblzma-sys", "zstd", "zstd-sys"]
        );
        assert!(compression_crates_in("tokio v1.0.0\nring v0.17.0\n").is_empty());
    }
}
