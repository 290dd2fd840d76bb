//! What `cargo xtask images` reads from `deploy/docker/*.Dockerfile`: the final stage (base,
//! COPY, ENV, EXPOSE, USER, WORKDIR, ENTRYPOINT, CMD) and, for each stage a COPY takes files
//! from, what that stage makes. The Dockerfiles stay the one description of the images: an
//! instruction or a stage this reader does not understand is refused by name, never skipped.

use anyhow::{Context, Result, bail};

/// The only base image the daemonless builder can assemble from this machine's files.
pub const DISTROLESS_CC_NONROOT: &str = "gcr.io/distroless/cc-debian12:nonroot";

/// One instruction, continuation lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// Line number (1-based) where it starts.
    pub line: usize,
    /// The keyword, upper-case.
    pub keyword: String,
    /// The rest of the instruction.
    pub args: String,
}

/// One `FROM` and what follows it.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The `FROM` image.
    pub base: String,
    /// The `AS` name.
    pub name: Option<String>,
    /// The `FROM` line.
    pub line: usize,
    /// The instructions after `FROM`.
    pub instructions: Vec<Instruction>,
}

/// What a build stage makes, as far as the builder can reproduce it with this machine's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageKind {
    /// `cargo build --release ... --bin NAME` with each binary installed at `/out/NAME`
    /// (`strip`: the stage runs `strip --strip-debug` on them).
    Cargo {
        /// The `-p` packages.
        packages: Vec<String>,
        /// The `--bin` names.
        bins: Vec<String>,
        /// Whether the binaries are stripped of debug information.
        strip: bool,
    },
    /// Debian's `busybox-static` at `/out/bin/busybox` with its applets as symlinks beside it.
    Busybox,
}

/// A `COPY --from=STAGE SRC... DEST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFrom {
    /// Line of the instruction.
    pub line: usize,
    /// The stage's name.
    pub stage: String,
    /// The source paths (in that stage).
    pub sources: Vec<String>,
    /// The destination (a directory when it ends with `/` or there are several sources).
    pub dest: String,
}

/// The final stage, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The base (always [`DISTROLESS_CC_NONROOT`] for now).
    pub base: String,
    /// The COPY instructions, in order (one layer each).
    pub copies: Vec<CopyFrom>,
    /// What each stage a COPY names makes, by stage name.
    pub stages: Vec<(String, StageKind)>,
    /// `ENV` (key, value), in order.
    pub env: Vec<(String, String)>,
    /// `EXPOSE`d ports as `PORT/PROTO`.
    pub exposed: Vec<String>,
    /// `USER`.
    pub user: Option<String>,
    /// `WORKDIR`.
    pub workdir: Option<String>,
    /// `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
    /// `CMD` (exec form).
    pub cmd: Option<Vec<String>>,
}

/// Splits a Dockerfile into instructions: comments and blank lines dropped, lines ending with
/// `\` joined with the next (comment lines inside a continuation are dropped, as Docker does).
pub fn instructions(text: &str) -> Result<Vec<Instruction>> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_none()) {
            continue;
        }
        let (start, mut acc) = current.take().unwrap_or((i + 1, String::new()));
        let (body, continues) = match trimmed.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (trimmed, false),
        };
        if !acc.is_empty() && !body.is_empty() {
            acc.push(' ');
        }
        acc.push_str(body);
        if continues {
            current = Some((start, acc));
            continue;
        }
        if acc.is_empty() {
            continue;
        }
        let (keyword, args) = acc.split_once(char::is_whitespace).unwrap_or((&acc, ""));
        out.push(Instruction {
            line: start,
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_owned(),
        });
    }
    if let Some((line, _)) = current {
        bail!("line {line}: the file ends inside a continued instruction");
    }
    Ok(out)
}

/// Groups instructions by `FROM`.
pub fn stages(text: &str) -> Result<Vec<Stage>> {
    let mut stages: Vec<Stage> = Vec::new();
    for ins in instructions(text)? {
        if ins.keyword == "FROM" {
            let words: Vec<&str> = ins.args.split_whitespace().collect();
            let (base, name) = match words.as_slice() {
                [base] => (*base, None),
                [base, as_, name] if as_.eq_ignore_ascii_case("as") => (*base, Some(*name)),
                _ => bail!(
                    "line {}: FROM {:?}: only `FROM IMAGE [AS NAME]` is understood",
                    ins.line,
                    ins.args
                ),
            };
            stages.push(Stage {
                base: base.to_owned(),
                name: name.map(str::to_owned),
                line: ins.line,
                instructions: Vec::new(),
            });
            continue;
        }
        match stages.last_mut() {
            Some(stage) => stage.instructions.push(ins),
            None => bail!("line {}: {} before the first FROM", ins.line, ins.keyword),
        }
    }
    if stages.is_empty() {
        bail!("no FROM");
    }
    Ok(stages)
}

/// A JSON array of strings (the exec form of ENTRYPOINT and CMD).
fn exec_form(ins: &Instruction) -> Result<Vec<String>> {
    serde_json::from_str::<Vec<String>>(&ins.args)
        .ok()
        .filter(|v| !v.is_empty())
        .with_context(|| {
            format!(
                "line {}: {} {}: only the exec form (a JSON array of strings) is understood",
                ins.line, ins.keyword, ins.args
            )
        })
}

/// What a stage makes, recognised from its `RUN`s.
fn stage_kind(stage: &Stage) -> Result<StageKind> {
    let name = stage.name.as_deref().unwrap_or("?");
    let runs: Vec<&str> = stage
        .instructions
        .iter()
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.as_str())
        .collect();
    let run = runs.join(" && ");
    if run.contains("cargo build") {
        let words: Vec<&str> = run.split_whitespace().collect();
        let after = |flag: &str| -> Vec<String> {
            words
                .windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1].to_owned())
                .collect()
        };
        if !words.contains(&"--release") || !words.contains(&"--locked") {
            bail!("stage {name}: `cargo build` without --release --locked");
        }
        let (packages, bins) = (after("-p"), after("--bin"));
        if bins.is_empty() {
            bail!("stage {name}: `cargo build` names no --bin");
        }
        for bin in &bins {
            let install = format!("install -D target/release/{bin} /out/{bin}");
            if !run.contains(&install) {
                bail!("stage {name}: --bin {bin} but no `{install}`");
            }
        }
        let strip = run.contains("strip");
        if strip {
            for bin in &bins {
                if !run.contains(&format!("/out/{bin}")) || !run.contains("strip --strip-debug") {
                    bail!("stage {name}: only `strip --strip-debug /out/BIN...` is understood");
                }
            }
        }
        return Ok(StageKind::Cargo {
            packages,
            bins,
            strip,
        });
    }
    if run.contains("busybox-static") {
        if !run.contains("cp /bin/busybox /out/bin/busybox") {
            bail!("stage {name}: installs busybox-static but does not copy it to /out/bin/busybox");
        }
        return Ok(StageKind::Busybox);
    }
    bail!(
        "stage {name} (line {}): `cargo xtask images` does not know how to make what it makes \
         (it understands a `cargo build --release` stage and a `busybox-static` stage)",
        stage.line
    )
}

/// Reads the final stage of a Dockerfile, and what each stage it copies from makes.
pub fn parse(text: &str) -> Result<ImageSpec> {
    let stages = stages(text)?;
    let Some((last, earlier)) = stages.split_last() else {
        bail!("no FROM");
    };
    if last.base != DISTROLESS_CC_NONROOT {
        bail!(
            "line {}: final stage FROM {}: the builder assembles only {DISTROLESS_CC_NONROOT} \
             (from this machine's files)",
            last.line,
            last.base
        );
    }
    let mut spec = ImageSpec {
        base: last.base.clone(),
        copies: Vec::new(),
        stages: Vec::new(),
        env: Vec::new(),
        exposed: Vec::new(),
        user: None,
        workdir: None,
        entrypoint: Vec::new(),
        cmd: None,
    };
    for ins in &last.instructions {
        match ins.keyword.as_str() {
            "COPY" => {
                let mut words = ins.args.split_whitespace();
                let from = words
                    .next()
                    .and_then(|w| w.strip_prefix("--from="))
                    .with_context(|| {
                        format!(
                            "line {}: COPY {}: only `COPY --from=STAGE SRC... DEST` is understood \
                             (no files from the build context, no other flags)",
                            ins.line, ins.args
                        )
                    })?;
                let mut paths: Vec<String> = words.map(str::to_owned).collect();
                if paths.iter().any(|p| p.starts_with("--")) || paths.len() < 2 {
                    bail!(
                        "line {}: COPY {}: only `COPY --from=STAGE SRC... DEST` is understood",
                        ins.line,
                        ins.args
                    );
                }
                let dest = paths.pop().unwrap_or_default();
                if !dest.starts_with('/') {
                    bail!("line {}: COPY destination {dest} is not absolute", ins.line);
                }
                if !spec.stages.iter().any(|(n, _)| n == from) {
                    let stage = earlier
                        .iter()
                        .find(|s| s.name.as_deref() == Some(from))
                        .with_context(|| {
                            format!("line {}: COPY --from={from}: no such stage", ins.line)
                        })?;
                    spec.stages.push((from.to_owned(), stage_kind(stage)?));
                }
                spec.copies.push(CopyFrom {
                    line: ins.line,
                    stage: from.to_owned(),
                    sources: paths,
                    dest,
                });
            }
            "ENV" => {
                let (k, v) = match ins.args.split_once('=') {
                    Some((k, v)) if !k.contains(char::is_whitespace) && !v.contains(' ') => (k, v),
                    _ => bail!(
                        "line {}: ENV {}: only one `KEY=VALUE` without quotes or spaces is \
                         understood",
                        ins.line,
                        ins.args
                    ),
                };
                if v.contains(['"', '\'', '$']) {
                    bail!(
                        "line {}: ENV {k}: quotes and `$` are not understood",
                        ins.line
                    );
                }
                spec.env.retain(|(key, _)| key != k);
                spec.env.push((k.to_owned(), v.to_owned()));
            }
            "EXPOSE" => {
                for port in ins.args.split_whitespace() {
                    let (number, proto) = port.split_once('/').unwrap_or((port, "tcp"));
                    if number.parse::<u16>().is_err() || !matches!(proto, "tcp" | "udp") {
                        bail!("line {}: EXPOSE {port}: not PORT[/tcp|/udp]", ins.line);
                    }
                    spec.exposed.push(format!("{number}/{proto}"));
                }
            }
            "USER" => {
                let user = ins.args.trim();
                let numeric = user
                    .split(':')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
                if !numeric || user.split(':').count() > 2 {
                    bail!(
                        "line {}: USER {user}: only numeric UID[:GID] is understood",
                        ins.line
                    );
                }
                spec.user = Some(user.to_owned());
            }
            "WORKDIR" => {
                let dir = ins.args.trim();
                if !dir.starts_with('/') || dir.contains(char::is_whitespace) || dir.contains('$') {
                    bail!(
                        "line {}: WORKDIR {dir}: only an absolute path is understood",
                        ins.line
                    );
                }
                spec.workdir = Some(dir.to_owned());
            }
            "ENTRYPOINT" => spec.entrypoint = exec_form(ins)?,
            "CMD" => spec.cmd = Some(exec_form(ins)?),
            other => bail!(
                "line {}: {other} in the final stage: `cargo xtask images` builds without a \
                 container engine and does not understand it (it understands COPY --from, ENV, \
                 EXPOSE, USER, WORKDIR, ENTRYPOINT and CMD)",
                ins.line
            ),
        }
    }
    if spec.entrypoint.is_empty() {
        bail!("the final stage has no ENTRYPOINT");
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTROLLER: &str = include_str!("../../deploy/docker/jumpstarter-controller.Dockerfile");
    const ROUTER: &str = include_str!("../../deploy/docker/jumpstarter-router.Dockerfile");
    const JMP: &str = include_str!("../../deploy/docker/jmp.Dockerfile");

    #[test]
    fn the_repository_dockerfiles_are_understood() -> Result<()> {
        let c = parse(CONTROLLER)?;
        assert_eq!(c.entrypoint, ["/usr/local/bin/jumpstarter-controller"]);
        assert_eq!(c.exposed, ["8082/tcp", "8083/tcp"]);
        assert_eq!(c.user.as_deref(), Some("65532:65532"));
        assert_eq!(
            c.stages,
            [(
                "build".to_owned(),
                StageKind::Cargo {
                    packages: vec!["jumpstarter-controller".into()],
                    bins: vec!["jumpstarter-controller".into()],
                    strip: true,
                }
            )]
        );
        let r = parse(ROUTER)?;
        assert_eq!(r.exposed, ["8083/tcp"]);
        let j = parse(JMP)?;
        assert_eq!(j.entrypoint, ["/usr/local/bin/jmp"]);
        assert!(j.stages.iter().any(|(_, k)| *k == StageKind::Busybox));
        assert_eq!(j.workdir.as_deref(), Some("/home/nonroot"));
        Ok(())
    }

    #[test]
    fn continuations_and_comments() -> Result<()> {
        let ins = instructions("# c\nFROM a AS b\nRUN x \\\n  # inner\n  && y\n\nUSER 1\n")?;
        assert_eq!(
            ins.iter()
                .map(|i| (i.line, i.args.as_str()))
                .collect::<Vec<_>>(),
            [(2, "a AS b"), (3, "x && y"), (7, "1")]
        );
        assert!(instructions("FROM a\nRUN x \\\n").is_err());
        Ok(())
    }

    #[test]
    fn unknown_instructions_and_forms_are_refused_by_name() {
        let base = format!("FROM {DISTROLESS_CC_NONROOT}\nENTRYPOINT [\"/x\"]\n");
        let err = |extra: &str| {
            parse(&format!("{base}{extra}\n"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("RUN echo hi").contains("RUN in the final stage"));
        assert!(err("HEALTHCHECK NONE").contains("HEALTHCHECK"));
        assert!(err("ENTRYPOINT /x --y").contains("exec form"));
        assert!(err("COPY a /b").contains("COPY --from=STAGE"));
        assert!(err("COPY --from=nope /a /b").contains("no such stage"));
        assert!(err("USER nonroot").contains("numeric"));
        assert!(err("ENV A=\"b c\"").contains("ENV"));
        assert!(
            parse("FROM debian:bookworm-slim\nENTRYPOINT [\"/x\"]\n")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("FROM debian:bookworm-slim")
        );
        let unknown_stage = format!(
            "FROM debian AS tools\nRUN apt-get install -y curl\n{base}COPY --from=tools /a /b\n"
        );
        assert!(
            parse(&unknown_stage)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("stage tools")
        );
        assert!(parse(&base).is_ok());
    }
}
