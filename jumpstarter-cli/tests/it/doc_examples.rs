//! The command blocks of README.md, docs/quickstart.md, docs/storage.md and
//! docs/virtual-pools.md, run against the
//! binaries cargo built, so that a doc example that stops working fails the tests.
//!
//! Each doc is one story: its fenced blocks tagged `sh`, `shell`, `bash` or `console` run in
//! order in one scratch environment (fresh `HOME`, `XDG_CONFIG_HOME`, `XDG_DATA_HOME`,
//! `XDG_RUNTIME_DIR`, `TMPDIR` and working directory; `jmp`, `j` and
//! `jumpstarter-controller` first on `PATH`), each block a `bash -e` script whose working
//! directory the next block starts in (variables do not carry over). A command ending in
//! `&` keeps running until the end of the doc, when its process group is stopped. The doc
//! runs in private user, network, mount and PID namespaces (`unshare`): the fixed ports of
//! the docs (8082, 19090, ...) are on a loopback of its own, so docs and other tests cannot
//! collide, and every process it started ends with it.
//!
//! A `console` block's lines starting with `$ ` are commands (each run as its own `bash -e`),
//! the lines after one, up to the next, the output it must print; a `text` block right after
//! an `sh` block (only blank lines between) is that block's output. In expected output, `...`
//! on a line of its own matches any lines, `...` or `[..]` within a line any text, and a
//! `...` ending the expected output also whatever follows. Output is stdout and stderr
//! together; a command shown without output is not checked.
//!
//! What cannot run verbatim is said in HTML comments right before the block (invisible
//! when rendered), one per line:
//!
//! - `<!-- doc-test: skip REASON -->`: not run (needs root, a real board, cargo, ...); the
//!   test prints every skipped block with its reason.
//! - `<!-- doc-test: file NAME -->`: a block that shows a file (`yaml`, ...) is written to
//!   NAME in the current directory.
//! - `<!-- doc-test: background -->`: the block is a server the doc shows in the
//!   foreground ("on the exporter host"); it runs in the background like a `CMD &`.
//! - `<!-- doc-test: wait-for-port PORT -->`: before the block, wait (up to 60 s) until
//!   127.0.0.1:PORT accepts connections.
//! - `<!-- doc-test: wait-until COMMAND -->`: before the block, run COMMAND until it
//!   succeeds (up to 60 s).
//! - `<!-- doc-test: setup COMMAND -->`: before the block, run COMMAND once: what the doc
//!   takes for granted (an image to flash, the config of the exporter a block runs in).
//! - `<!-- doc-test: env NAME=VALUE -->`: the block runs with NAME set (an `EDITOR` that
//!   makes the edit the doc describes, say).
//! - `<!-- doc-test: stdin "TEXT" -->`: the block's standard input (`\n` escapes), for the
//!   interactive `jmp shell`; otherwise it is empty.
//! - `<!-- doc-test: inside COMMAND -->`: the block runs as `COMMAND -- bash -e -c BLOCK`,
//!   for the `j` commands a doc shows "inside `jmp shell`".
//! - `<!-- doc-test: output-of COMMAND -->`: on a `text` block: COMMAND prints it (checked
//!   as soon as it matches, then COMMAND is stopped; its exit code is not checked).
//! - `<!-- doc-test: varies WORD "SOME WORDS" ... -->`: on expected output: these parts of
//!   the example differ from run to run (ports, times) and match any text.
//!
//! Another doc is one more `#[test]` calling [`doc_test`]. Where `unshare` cannot make the
//! namespaces, a doc with commands to run is skipped, saying so.

use std::{
    fs::{self, File},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use rustix::process::{
    Pid, Signal, WaitOptions, kill_process_group, test_kill_process_group, wait,
};

use crate::{J, JMP};

/// Set in the environment of the test's own run inside the namespaces: the directory it
/// writes its transcript and error to.
const INSIDE: &str = "JMP_DOC_TEST_INSIDE";
/// The directory of the `jumpstarter-controller` binary, for the run inside.
const CONTROLLER_DIR: &str = "JMP_DOC_TEST_CONTROLLER_DIR";
/// The most a doc may take, and one command or wait.
const DOC_TIMEOUT: Duration = Duration::from_secs(120);
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn readme() {
    doc_test("readme", "README.md");
}

#[test]
fn quickstart() {
    doc_test("quickstart", "docs/quickstart.md");
}

#[test]
fn storage() {
    doc_test("storage", "docs/storage.md");
}

#[test]
fn virtual_pools() {
    doc_test("virtual_pools", "docs/virtual-pools.md");
}

/// Runs the blocks of `doc` (relative to the workspace root); `test` is the name of the
/// calling test, which runs again inside the namespaces.
fn doc_test(test: &str, doc: &str) {
    let blocks = parse(doc, &read_doc(doc)).unwrap_or_else(|e| panic!("{e}"));
    if let Some(report) = std::env::var_os(INSIDE) {
        inside(doc, &blocks, Path::new(&report));
        return;
    }
    if !blocks.iter().any(Block::runs) {
        // Nothing to start: no namespaces needed.
        let lab = Lab::new(doc);
        let result = lab.and_then_run(&blocks);
        print!("{}", result.0);
        if let Err(e) = result.1 {
            panic!("{e}");
        }
        return;
    }
    let Some(unshare) = namespaces() else {
        println!(
            "{doc}: SKIPPED: its commands use fixed ports and run in private network \
             namespaces, which `unshare` cannot create here (`unshare --user --map-root-user \
             --net --mount --pid --fork` with iproute2's `ip`)"
        );
        return;
    };
    let controller = controller_dir();
    let report = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    // One open file for both, so that they do not write over each other.
    let out = log.reopen().unwrap();
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let mut child = Command::new("unshare")
        .args(unshare)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", &format!("{module}::{test}")])
        .args(["--nocapture", "--test-threads=1"])
        .env(INSIDE, report.path())
        .env(CONTROLLER_DIR, controller)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, DOC_TIMEOUT + Duration::from_secs(30));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let read = |name: &str| fs::read_to_string(report.path().join(name)).unwrap_or_default();
    let (transcript, error) = (read("transcript"), read("error"));
    print!("{transcript}");
    match status {
        Some(s) if s.success() && transcript.contains(doc) => {}
        _ if !error.is_empty() => panic!("{error}"),
        // The run inside did not get to report: its own output says why.
        Some(s) => panic!(
            "{doc}: the test inside the namespaces failed ({s}):\n{}",
            fs::read_to_string(log.path()).unwrap_or_default()
        ),
        None => panic!(
            "{doc}: still running after {DOC_TIMEOUT:?}:\n{}",
            fs::read_to_string(log.path()).unwrap_or_default()
        ),
    }
}

fn read_doc(doc: &str) -> String {
    let path = workspace_root().join(doc);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

/// The `unshare` arguments that work here (user namespaces, or plain ones as root), with a
/// loopback that `ip` can bring up; `None` when neither does.
fn namespaces() -> Option<&'static [&'static str]> {
    const WITH_USER: &[&str] = &[
        "--user",
        "--map-root-user",
        "--net",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
    ];
    const AS_ROOT: &[&str] = &["--net", "--mount", "--pid", "--fork", "--kill-child"];
    static WORKS: OnceLock<Option<&'static [&'static str]>> = OnceLock::new();
    *WORKS.get_or_init(|| {
        [WITH_USER, AS_ROOT].into_iter().find(|args| {
            Command::new("unshare")
                .args(*args)
                .args(["--", "ip", "link", "set", "lo", "up"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

/// The directory of the `jumpstarter-controller` binary, beside `jmp`. It is another
/// package's, so cargo does not build it for these tests: `cargo test --workspace` does (as
/// `cargo xtask ci` runs them). Building it from inside a test would compete with the test
/// run for the machine and could build it with other settings than the run's.
pub(crate) fn controller_dir() -> PathBuf {
    let dir = Path::new(JMP).parent().unwrap().to_path_buf();
    let bin = dir.join("jumpstarter-controller");
    assert!(
        bin.exists(),
        "{} is missing: run these tests with `cargo test --workspace` (or `cargo build -p \
         jumpstarter-controller` first)",
        bin.display()
    );
    dir
}

// ---------------------------------------------------------------------------------------
// The Markdown

/// A doc-test annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Note {
    Skip(String),
    File(String),
    Background,
    WaitForPort(u16),
    WaitUntil(String),
    Env(String, String),
    Stdin(String),
    OutputOf(String),
    Varies(Vec<String>),
    Setup(String),
    Inside(String),
}

/// A fenced block.
#[derive(Debug)]
struct Block {
    /// The line of its opening fence.
    line: usize,
    lang: String,
    body: Vec<String>,
    notes: Vec<Note>,
    /// Only blank lines between the previous block and this one.
    adjacent: bool,
}

impl Block {
    fn runnable(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "shell" | "bash" | "console")
    }

    fn skip(&self) -> Option<&str> {
        self.notes.iter().find_map(|n| match n {
            Note::Skip(r) => Some(r.as_str()),
            _ => None,
        })
    }

    fn output_of(&self) -> Option<&str> {
        self.notes.iter().find_map(|n| match n {
            Note::OutputOf(c) => Some(c.as_str()),
            _ => None,
        })
    }

    /// Whether running the doc starts anything for this block.
    fn runs(&self) -> bool {
        self.skip().is_none() && (self.runnable() || self.output_of().is_some())
    }

    fn varies(&self) -> Vec<String> {
        self.notes
            .iter()
            .flat_map(|n| match n {
                Note::Varies(v) => v.clone(),
                _ => Vec::new(),
            })
            .collect()
    }
}

fn parse(doc: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut blocks: Vec<Block> = Vec::new();
    let mut notes: Vec<Note> = Vec::new();
    let mut note_line = 0;
    let mut adjacent = false;
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    while let Some((n, line)) = lines.next() {
        let t = line.trim();
        if let Some(info) = t.strip_prefix("```") {
            let indent = line.len() - line.trim_start().len();
            let lang = info.split([',', ' ', '{']).next().unwrap_or("").to_string();
            let mut body = Vec::new();
            loop {
                match lines.next() {
                    None => return Err(format!("{doc}:{n}: the block never ends")),
                    Some((_, l)) if l.trim() == "```" => break,
                    Some((_, l)) => {
                        let lead = l.len() - l.trim_start_matches(' ').len();
                        body.push(l[lead.min(indent)..].to_string());
                    }
                }
            }
            let block = Block {
                line: n,
                lang,
                body,
                adjacent: adjacent && notes.is_empty(),
                notes: std::mem::take(&mut notes),
            };
            check_notes(doc, &block, blocks.last())?;
            blocks.push(block);
            adjacent = true;
            continue;
        }
        if let Some(note) = t
            .strip_prefix("<!-- doc-test:")
            .and_then(|r| r.strip_suffix("-->"))
        {
            notes.push(parse_note(note.trim()).map_err(|e| format!("{doc}:{n}: {e}"))?);
            note_line = n;
            adjacent = false;
            continue;
        }
        if t.contains("doc-test") && t.starts_with("<!--") {
            return Err(format!(
                "{doc}:{n}: a doc-test annotation is one line: `<!-- doc-test: ... -->`"
            ));
        }
        if !t.is_empty() {
            if !notes.is_empty() {
                return Err(format!(
                    "{doc}:{note_line}: a doc-test annotation must come right before a block"
                ));
            }
            adjacent = false;
        }
    }
    if !notes.is_empty() {
        return Err(format!("{doc}:{note_line}: an annotation without a block"));
    }
    Ok(blocks)
}

fn parse_note(s: &str) -> Result<Note, String> {
    let (word, rest) = s.split_once(' ').unwrap_or((s, ""));
    let rest = rest.trim();
    let nonempty = |what: &str| {
        if rest.is_empty() {
            Err(format!("`{word}` needs {what}"))
        } else {
            Ok(rest.to_string())
        }
    };
    Ok(match word {
        "skip" => {
            let reason = nonempty("a reason")?;
            let bare = reason.strip_prefix('(').and_then(|r| r.strip_suffix(')'));
            Note::Skip(bare.unwrap_or(&reason).to_string())
        }
        "file" => Note::File(nonempty("a file name")?),
        "background" if rest.is_empty() => Note::Background,
        "wait-for-port" => Note::WaitForPort(
            rest.parse()
                .map_err(|_| format!("`wait-for-port` needs a port, not {rest:?}"))?,
        ),
        "wait-until" => Note::WaitUntil(nonempty("a command")?),
        "env" => {
            let (k, v) = rest
                .split_once('=')
                .filter(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
                .ok_or_else(|| format!("`env` needs NAME=VALUE, not {rest:?}"))?;
            Note::Env(k.into(), v.into())
        }
        "stdin" => {
            let words = words(rest)?;
            let [text] = words.as_slice() else {
                return Err(format!("`stdin` needs one quoted text, not {rest:?}"));
            };
            Note::Stdin(text.clone())
        }
        "output-of" => Note::OutputOf(nonempty("a command")?),
        "setup" => Note::Setup(nonempty("a command")?),
        "inside" => Note::Inside(nonempty("a command")?),
        "varies" => Note::Varies(words(rest)?),
        _ => {
            return Err(format!(
                "unknown doc-test annotation {s:?}; known: skip REASON, file NAME, background, \
                 wait-for-port PORT, wait-until COMMAND, setup COMMAND, env NAME=VALUE, \
                 stdin \"TEXT\", inside COMMAND, output-of COMMAND, varies WORDS"
            ));
        }
    })
}

/// Splits `s` into words: bare, or in double quotes with `\n`, `\t`, `\"` and `\\`.
fn words(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut w = String::new();
            loop {
                match chars.next() {
                    None => return Err(format!("unclosed quote in {s:?}")),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => w.push('\n'),
                        Some('t') => w.push('\t'),
                        Some(c @ ('"' | '\\')) => w.push(c),
                        other => return Err(format!("unknown escape \\{other:?} in {s:?}")),
                    },
                    Some(c) => w.push(c),
                }
            }
            out.push(w);
        } else {
            let mut w = String::new();
            while let Some(&c) = chars.peek().filter(|c| !c.is_whitespace()) {
                w.push(c);
                chars.next();
            }
            out.push(w);
        }
    }
    if out.is_empty() {
        return Err("`varies`/`stdin` need at least one word".into());
    }
    Ok(out)
}

/// Checks that `block`'s annotations fit it.
fn check_notes(doc: &str, block: &Block, previous: Option<&Block>) -> Result<(), String> {
    let output_of_previous =
        block.lang == "text" && block.adjacent && previous.is_some_and(Block::runnable);
    for note in &block.notes {
        let fits = match note {
            Note::Skip(_) => block.runnable() || block.output_of().is_some(),
            Note::Background | Note::Stdin(_) | Note::Inside(_) => block.runnable(),
            Note::WaitForPort(_) | Note::WaitUntil(_) | Note::Setup(_) | Note::Env(..) => {
                block.runnable() || block.output_of().is_some()
            }
            Note::File(_) => !block.runnable(),
            Note::OutputOf(_) => block.lang == "text",
            Note::Varies(_) => {
                block.lang == "console" || block.output_of().is_some() || output_of_previous
            }
        };
        if !fits {
            return Err(format!(
                "{doc}:{}: the annotation {note:?} does not fit a `{}` block",
                block.line, block.lang
            ));
        }
    }
    Ok(())
}

/// A `$ ` command of a console block.
struct ConsoleCommand {
    /// The doc line of its `$ `.
    line: usize,
    script: String,
    expected: Vec<String>,
}

fn console_commands(doc: &str, block: &Block) -> Result<Vec<ConsoleCommand>, String> {
    let mut out: Vec<ConsoleCommand> = Vec::new();
    let mut continued = false;
    for (i, l) in block.body.iter().enumerate() {
        let line = block.line + 1 + i;
        if continued && let Some(c) = out.last_mut() {
            c.script.push('\n');
            c.script.push_str(l);
        } else if let Some(cmd) = l.strip_prefix("$ ") {
            out.push(ConsoleCommand {
                line,
                script: cmd.to_string(),
                expected: Vec::new(),
            });
        } else if let Some(c) = out.last_mut() {
            c.expected.push(l.clone());
            continue;
        } else {
            return Err(format!(
                "{doc}:{line}: a console block starts with a `$ ` command"
            ));
        }
        // A command line ending in `\` goes on on the next line.
        continued = l.trim_end().ends_with('\\');
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Expected output

/// `s` without terminal escapes, trailing blanks and trailing empty lines.
fn normalize(s: &str) -> Vec<String> {
    let mut clean = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            clean.push(c);
        }
    }
    let mut lines: Vec<String> = clean.lines().map(|l| l.trim_end().to_string()).collect();
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines
}

/// The parts of a pattern line between its wildcards (`[..]`, `...`).
fn parts(pattern: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = pattern;
    loop {
        let next = [
            rest.find("[..]").map(|i| (i, 4)),
            rest.find("...").map(|i| (i, 3)),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some((i, len)) => {
                out.push(&rest[..i]);
                rest = &rest[i + len..];
            }
            None => {
                out.push(rest);
                return out;
            }
        }
    }
}

fn line_matches(pattern: &str, line: &str) -> bool {
    let p = parts(pattern);
    let (first, last) = (p[0], p[p.len() - 1]);
    if p.len() == 1 {
        return pattern == line;
    }
    if line.len() < first.len() + last.len() || !line.starts_with(first) || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for m in &p[1..p.len() - 1] {
        match rest.find(m) {
            Some(i) => rest = &rest[i + m.len()..],
            None => return false,
        }
    }
    true
}

fn lines_match(expected: &[String], actual: &[String]) -> bool {
    let Some((first, rest)) = expected.split_first() else {
        return actual.is_empty();
    };
    if first.trim() == "..." {
        return (0..=actual.len()).any(|k| lines_match(rest, &actual[k..]));
    }
    let Some((line, after)) = actual.split_first() else {
        return false;
    };
    line_matches(first, line)
        && ((rest.is_empty() && first.ends_with("...")) || lines_match(rest, after))
}

/// Compares `actual` with the expected lines of the doc (their first at doc line `line`).
fn compare(
    doc: &str,
    line: usize,
    what: &str,
    expected: &[String],
    varies: &[String],
    actual: &str,
) -> Result<(), String> {
    let mut expected: Vec<String> = expected
        .iter()
        .map(|l| {
            varies.iter().fold(l.trim_end().to_string(), |l, v| {
                l.replace(v.as_str(), "[..]")
            })
        })
        .collect();
    while expected.last().is_some_and(String::is_empty) {
        expected.pop();
    }
    let actual = normalize(actual);
    if lines_match(&expected, &actual) {
        return Ok(());
    }
    // The first expected line with no match, for the message.
    let mut at = 0;
    let mut first_miss = None;
    for (i, e) in expected.iter().enumerate() {
        if e.trim() == "..." {
            continue;
        }
        let after_dots = i > 0 && expected[i - 1].trim() == "...";
        let found = if after_dots {
            actual[at..].iter().position(|a| line_matches(e, a))
        } else {
            actual.get(at).filter(|a| line_matches(e, a)).map(|_| 0)
        };
        match found {
            Some(k) => at += k + 1,
            None => {
                first_miss = Some(i);
                break;
            }
        }
    }
    let miss = match first_miss {
        Some(i) => format!(
            "{doc}:{}: expected {:?}, the command printed {:?}",
            line + i,
            expected[i],
            actual.get(at).map_or("(nothing more)", String::as_str)
        ),
        None => format!("the command printed more lines than {doc} shows"),
    };
    Err(format!(
        "{doc}:{line}: the output of {what} is not what the doc shows\n{miss}\n\
         --- the doc ({doc}:{line}; `...` and `[..]` match any text):\n{}\n\
         --- the command printed:\n{}\n---",
        expected.join("\n"),
        actual.join("\n")
    ))
}

// ---------------------------------------------------------------------------------------
// Running a doc

/// Inside the namespaces: brings up the loopback, hides `/etc/jumpstarter`, runs the doc;
/// the transcript and the error, if any, go to files in `report` for the test outside.
fn inside(doc: &str, blocks: &[Block], report: &Path) {
    let up = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .unwrap();
    assert!(up.success(), "cannot bring up the loopback");
    // `jmp admin create exporter --save` writes to /etc/jumpstarter/exporters when it can:
    // a tmpfs over it keeps this machine's configs out of the doc's story and safe from it.
    if Path::new("/etc/jumpstarter").is_dir() {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs", "/etc/jumpstarter"])
            .status()
            .unwrap();
        assert!(st.success(), "cannot hide /etc/jumpstarter");
    }
    let lab = Lab::new(doc);
    let (transcript, result) = lab.and_then_run(blocks);
    fs::write(report.join("transcript"), &transcript).unwrap();
    if let Err(e) = result {
        fs::write(report.join("error"), &e).unwrap();
        panic!("{e}");
    }
}

/// One doc's scratch environment.
struct Lab {
    doc: String,
    dir: tempfile::TempDir,
    cwd: PathBuf,
    env: Vec<(String, String)>,
    /// Process groups of the scripts run (and what runs on in them).
    groups: Vec<i32>,
    /// The logs of what runs in the background, with the doc line that started it.
    background: Vec<(usize, PathBuf)>,
    steps: usize,
    started: Instant,
    transcript: String,
    skipped: Vec<(usize, String)>,
}

impl Lab {
    fn new(doc: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let run = dir.path().join("run");
        for d in [
            &home,
            &run,
            &dir.path().join("tmp"),
            &dir.path().join("logs"),
        ] {
            fs::create_dir_all(d).unwrap();
        }
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        let cwd = dir.path().join("work");
        fs::create_dir_all(&cwd).unwrap();
        let mut path = vec![Path::new(JMP).parent().unwrap().to_path_buf()];
        if let Some(c) = std::env::var_os(CONTROLLER_DIR) {
            path.push(c.into());
        }
        assert_eq!(Path::new(J).parent(), Some(path[0].as_path()));
        path.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        let path = std::env::join_paths(path).unwrap();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let env = vec![
            ("PATH".into(), path.to_string_lossy().into_owned()),
            ("HOME".into(), s(&home)),
            ("XDG_CONFIG_HOME".into(), s(&home.join(".config"))),
            ("XDG_DATA_HOME".into(), s(&home.join(".local/share"))),
            ("XDG_RUNTIME_DIR".into(), s(&run)),
            ("TMPDIR".into(), s(&dir.path().join("tmp"))),
            ("SHELL".into(), "/bin/bash".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        Self {
            doc: doc.into(),
            dir,
            cwd,
            env,
            groups: Vec::new(),
            background: Vec::new(),
            steps: 0,
            started: Instant::now(),
            transcript: String::new(),
            skipped: Vec::new(),
        }
    }

    /// Runs `blocks`, then stops what runs on; returns the transcript and the result.
    fn and_then_run(mut self, blocks: &[Block]) -> (String, Result<(), String>) {
        let mut result = self.run(blocks);
        self.stop_all();
        if let Err(e) = &mut result {
            for (line, log) in &self.background {
                let text = fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                e.push_str(&format!(
                    "\n--- the output of what {}:{line} started in the background:\n{}",
                    self.doc,
                    tail.join("\n")
                ));
            }
        }
        let mut t = std::mem::take(&mut self.transcript);
        t.push_str(&format!(
            "{}: {} block(s) skipped, in {:.1} s\n",
            self.doc,
            self.skipped.len(),
            self.started.elapsed().as_secs_f64()
        ));
        for (line, reason) in &self.skipped {
            t.push_str(&format!("  skipped {}:{line}: {reason}\n", self.doc));
        }
        (t, result)
    }

    fn say(&mut self, line: usize, what: &str) {
        self.transcript.push_str(&format!(
            "[{:5.1} s] {}:{line}: {what}\n",
            self.started.elapsed().as_secs_f64(),
            self.doc
        ));
    }

    fn run(&mut self, blocks: &[Block]) -> Result<(), String> {
        let doc = self.doc.clone();
        let mut i = 0;
        while let Some(b) = blocks.get(i) {
            i += 1;
            // A text block right after a runnable one shows its output.
            let output = blocks
                .get(i)
                .filter(|n| b.runnable() && n.lang == "text" && n.adjacent);
            if output.is_some() {
                i += 1;
            }
            if self.started.elapsed() > DOC_TIMEOUT {
                return Err(format!(
                    "{doc}:{}: the doc took more than {DOC_TIMEOUT:?} so far",
                    b.line
                ));
            }
            if let Some(reason) = b.skip() {
                self.say(b.line, &format!("skipped: {reason}"));
                self.skipped.push((b.line, reason.to_string()));
                continue;
            }
            if let Some(name) = b.notes.iter().find_map(|n| match n {
                Note::File(f) => Some(f),
                _ => None,
            }) {
                let mut text = b.body.join("\n");
                text.push('\n');
                fs::write(self.cwd.join(name), text)
                    .map_err(|e| format!("{doc}:{}: cannot write {name}: {e}", b.line))?;
                self.say(b.line, &format!("wrote {name}"));
                continue;
            }
            if !b.runs() {
                continue;
            }
            for note in &b.notes {
                match note {
                    Note::WaitForPort(p) => self.wait_for_port(b.line, *p)?,
                    Note::WaitUntil(c) => self.wait_until(b.line, c)?,
                    Note::Setup(c) => {
                        self.foreground(b.line, c, &[])
                            .map_err(|e| format!("the setup of the block failed: {e}"))?;
                    }
                    _ => {}
                }
            }
            if let Some(command) = b.output_of() {
                self.output_of(b, command)?;
            } else if b.lang == "console" {
                for c in console_commands(&doc, b)? {
                    let out = self.foreground(c.line, &c.script, &b.notes)?;
                    if !c.expected.is_empty() {
                        compare(&doc, c.line + 1, &c.script, &c.expected, &b.varies(), &out)?;
                    }
                }
            } else {
                let script = b.body.join("\n");
                if b.notes.contains(&Note::Background) {
                    let (_, log) = self.spawn(b.line + 1, &script, &b.notes)?;
                    self.background.push((b.line, log));
                    self.say(b.line, "started in the background");
                    continue;
                }
                let out = self.foreground(b.line + 1, &script, &b.notes)?;
                if script.lines().any(|l| {
                    let l = l.split(" #").next().unwrap_or(l).trim_end();
                    l.ends_with('&') && !l.ends_with("&&")
                }) {
                    // What it started goes on writing to this log.
                    let log = self.log_path(self.steps, b.line + 1);
                    self.background.push((b.line, log));
                }
                if let Some(text) = output {
                    compare(
                        &doc,
                        text.line + 1,
                        "the block",
                        &text.body,
                        &text.varies(),
                        &out,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn log_path(&self, step: usize, line: usize) -> PathBuf {
        self.dir
            .path()
            .join("logs")
            .join(format!("{step:03}-line{line}.log"))
    }

    /// Starts `script` (its first line at doc line `line`) with `bash -e` in its own process
    /// group, in the current directory, with what `notes` say (env, stdin, inside), its
    /// stdout and stderr into a log; the directory it ends in becomes the current one once it
    /// is waited for ([`Lab::foreground`]), and the line of the command that failed is noted.
    fn spawn(
        &mut self,
        line: usize,
        script: &str,
        notes: &[Note],
    ) -> Result<(Child, PathBuf), String> {
        self.steps += 1;
        let log = self.log_path(self.steps, line);
        let cwd_file = log.with_extension("cwd");
        let out = File::create(&log).unwrap();
        let script = format!(
            "trap 'pwd >\"$JMP_DOC_TEST_CWD_FILE\"' EXIT\n\
             trap 'echo $LINENO >\"$JMP_DOC_TEST_CWD_FILE.failed\"' ERR\n{script}\n"
        );
        let mut bash = Command::new("bash");
        bash.current_dir(&self.cwd)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("JMP_DOC_TEST_CWD_FILE", &cwd_file)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .args(["-e", "-c"]);
        match notes.iter().find_map(|n| match n {
            Note::Inside(c) => Some(c),
            _ => None,
        }) {
            // The script is the command of COMMAND (`jmp shell ... -- bash -e -c SCRIPT`).
            Some(command) => bash
                .arg(format!("{command} -- bash -e -c \"$JMP_DOC_TEST_SCRIPT\""))
                .env("JMP_DOC_TEST_SCRIPT", &script),
            None => bash.arg(&script),
        };
        for note in notes {
            match note {
                Note::Env(k, v) => {
                    bash.env(k, v);
                }
                Note::Stdin(text) => {
                    let p = log.with_extension("stdin");
                    fs::write(&p, text).unwrap();
                    bash.stdin(File::open(&p).unwrap());
                }
                _ => {}
            }
        }
        let child = bash
            .spawn()
            .map_err(|e| format!("{}:{line}: cannot start bash: {e}", self.doc))?;
        self.groups.push(child.id() as i32);
        Ok((child, log))
    }

    /// Runs `script` (its first line at doc line `line`) to its end (at most
    /// [`STEP_TIMEOUT`]); returns its output, or how it failed.
    fn foreground(&mut self, line: usize, script: &str, notes: &[Note]) -> Result<String, String> {
        let started = Instant::now();
        let (mut child, log) = self.spawn(line, script, notes)?;
        let status = wait_bounded(&mut child, self.step_timeout());
        let out = fs::read_to_string(&log).unwrap_or_default();
        let Some(status) = status else {
            kill_group(child.id(), Signal::KILL);
            let _ = child.wait();
            return Err(format!(
                "{}:{line}: still running after {:?}:\n{script}\n--- its output:\n{out}---",
                self.doc,
                self.step_timeout()
            ));
        };
        if let Ok(cwd) = fs::read_to_string(log.with_extension("cwd")) {
            let cwd = PathBuf::from(cwd.trim_end_matches('\n'));
            if cwd.is_dir() {
                self.cwd = cwd;
            }
        }
        let first: String = script
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(60)
            .collect();
        self.say(
            line,
            &format!(
                "ran `{first}...` in {:.1} s",
                started.elapsed().as_secs_f64()
            ),
        );
        if status.success() {
            return Ok(out);
        }
        // The script's line 3 is the doc's `line` (two lines of traps come first).
        let failed = fs::read_to_string(log.with_extension("cwd.failed"))
            .ok()
            .and_then(|n| n.trim().parse::<usize>().ok())
            .filter(|&n| n >= 3 && n - 3 < script.lines().count());
        let (at, what) = match failed {
            Some(n) => (
                line + n - 3,
                format!("`{}`", script.lines().nth(n - 3).unwrap_or("").trim()),
            ),
            None => (line, "the block".to_string()),
        };
        Err(format!(
            "{}:{at}: {what} failed ({status}); the block:\n{script}\n--- its output:\n{out}---",
            self.doc
        ))
    }

    fn step_timeout(&self) -> Duration {
        STEP_TIMEOUT.min(DOC_TIMEOUT.saturating_sub(self.started.elapsed()))
    }

    /// Runs `command` until its output is the text of `block` (then stops it), or it ends.
    fn output_of(&mut self, block: &Block, command: &str) -> Result<(), String> {
        let doc = self.doc.clone();
        let (mut child, log) = self.spawn(block.line, command, &block.notes)?;
        let deadline = Instant::now() + self.step_timeout();
        let check = |out: &str| {
            compare(
                &doc,
                block.line + 1,
                command,
                &block.body,
                &block.varies(),
                out,
            )
        };
        // Without a `...` line, the expected text is about as many lines as it has: once
        // that many are complete, more output cannot change the result.
        let lines = (!block.body.iter().any(|l| l.trim() == "...")).then_some(block.body.len());
        loop {
            let ended = child.try_wait().ok().flatten().is_some();
            let out = fs::read_to_string(&log).unwrap_or_default();
            let result = check(&out);
            let complete = normalize(out.get(..=out.rfind('\n').unwrap_or(0)).unwrap_or("")).len();
            let decided = lines.is_some_and(|n| complete >= n);
            if result.is_ok() || ended || decided || Instant::now() > deadline {
                if !ended {
                    kill_group(child.id(), Signal::TERM);
                    if wait_bounded(&mut child, Duration::from_secs(10)).is_none() {
                        kill_group(child.id(), Signal::KILL);
                        let _ = child.wait();
                    }
                }
                self.say(block.line, &format!("checked the output of `{command}`"));
                return result.map_err(|e| {
                    if ended || decided {
                        e
                    } else {
                        format!("{e}\n(still running after {:?})", self.step_timeout())
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_for_port(&mut self, line: usize, port: u16) -> Result<(), String> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + self.step_timeout();
        while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "{}:{line}: nothing listens on {addr} after {:?}",
                    self.doc,
                    self.step_timeout()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.say(line, &format!("{addr} is up"));
        Ok(())
    }

    fn wait_until(&mut self, line: usize, command: &str) -> Result<(), String> {
        let deadline = Instant::now() + self.step_timeout();
        loop {
            let (mut child, log) = self.spawn(line, command, &[])?;
            let status = wait_bounded(&mut child, Duration::from_secs(10));
            if status.is_none() {
                kill_group(child.id(), Signal::KILL);
                let _ = child.wait();
            }
            if status.is_some_and(|s| s.success()) {
                self.say(line, &format!("`{command}` succeeded"));
                return Ok(());
            }
            if Instant::now() > deadline {
                let out = fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "{}:{line}: `{command}` did not succeed within {:?}; its last output:\n{out}",
                    self.doc,
                    self.step_timeout()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops every process group the doc started: SIGTERM, then SIGKILL after 5 s.
    fn stop_all(&mut self) {
        for &g in &self.groups {
            kill_group(g as u32, Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            reap_orphans();
            let alive: Vec<i32> = self
                .groups
                .iter()
                .copied()
                .filter(|&g| Pid::from_raw(g).is_some_and(|p| test_kill_process_group(p).is_ok()))
                .collect();
            if alive.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                for &g in &alive {
                    kill_group(g as u32, Signal::KILL);
                }
                std::thread::sleep(Duration::from_millis(100));
                reap_orphans();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.groups.clear();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Inside the PID namespace the test is its init: the processes whose parent ended (what a
/// block left running) are its children, and it reaps them once they end. Anywhere else it
/// leaves other tests' children alone.
fn reap_orphans() {
    if std::process::id() == 1 {
        while let Ok(Some(_)) = wait(WaitOptions::NOHANG) {}
    }
}

fn kill_group(pgid: u32, signal: Signal) {
    if let Some(p) = i32::try_from(pgid).ok().and_then(Pid::from_raw)
        && p != Pid::INIT
    {
        let _ = kill_process_group(p, signal);
    }
}

/// Waits for `child` at most `timeout`; `None` if it still runs.
fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------
// The harness itself

#[test]
fn expected_output_with_wildcards() {
    let lines = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    let ok = |e: &str, a: &str| compare("d.md", 1, "x", &lines(e), &[], a).is_ok();
    assert!(ok("a\nb", "a\nb\n\n"));
    assert!(!ok("a\nb", "a\nc"));
    assert!(!ok("a", "a\nb"));
    assert!(ok("port [..] open", "port 8082 open"));
    assert!(ok(
        "from ... since [..] UTC",
        "from 1.2.3.4:5 since 12:00 UTC"
    ));
    assert!(!ok(
        "from ... since [..] UTC",
        "from 1.2.3.4:5 since 12:00 CET"
    ));
    assert!(ok("a\n...\nz", "a\nb\nc\nz"));
    assert!(ok("a\n...\nz", "a\nz"));
    assert!(!ok("a\n...\nz", "a\nb"));
    // A `...` ending the expected output: the rest of the line and the lines after it.
    assert!(ok("ERROR x. ...", "ERROR x. more\nWARN y\n"));
    assert!(!ok("ERROR x. ...", "WARN y\nERROR x. more"));
    assert!(ok("[..]", "x"));
    assert!(!ok("ab[..]ba", "aba"));
    let varies = ["40112".to_string(), "2026-12-06 19:40:02".to_string()];
    assert!(
        compare(
            "d.md",
            1,
            "x",
            &lines("from 127.0.0.1:40112 since 2026-12-06 19:40:02 UTC"),
            &varies,
            "from 127.0.0.1:33646 since 2027-01-01 00:00:00 UTC"
        )
        .is_ok()
    );
    let e = compare("d.md", 7, "x", &lines("one\ntwo"), &[], "one\nthree").unwrap_err();
    assert!(
        e.contains("d.md:8: expected \"two\", the command printed \"three\""),
        "{e}"
    );
}

#[test]
fn annotations_are_checked() {
    let parsed = parse(
        "d.md",
        "<!-- doc-test: skip (needs a board) -->\n```sh\nj power on\n```\n\n\
         <!-- doc-test: stdin \"j power on\\nexit\\n\" -->\n<!-- doc-test: env EDITOR=sed -i 's/a/b/' -->\n\
         ```console\n$ jmp shell \\\n  -l a=b\n$ j power read\nvoltage=[..]\n```\n\n```text\nout\n```\n",
    )
    .unwrap();
    assert_eq!(parsed[0].skip(), Some("needs a board"));
    assert_eq!(
        parsed[1].notes,
        [
            Note::Stdin("j power on\nexit\n".into()),
            Note::Env("EDITOR".into(), "sed -i 's/a/b/'".into())
        ]
    );
    let cmds = console_commands("d.md", &parsed[1]).unwrap();
    assert_eq!(cmds[0].script, "jmp shell \\\n  -l a=b");
    assert_eq!((cmds[1].line, cmds[1].expected.len()), (11, 1));
    assert!(parsed[2].adjacent);
    for (bad, why) in [
        ("<!-- doc-test: skip -->\n```sh\nx\n```\n", "needs a reason"),
        (
            "<!-- doc-test: skip x -->\ntext\n```sh\nx\n```\n",
            "right before",
        ),
        ("<!-- doc-test: sleep 3 -->\n```sh\nx\n```\n", "unknown"),
        (
            "<!-- doc-test: file a.yaml -->\n```sh\nx\n```\n",
            "does not fit",
        ),
        ("<!-- doc-test: skip x -->\n", "without a block"),
    ] {
        let e = parse("d.md", bad).unwrap_err();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
}
