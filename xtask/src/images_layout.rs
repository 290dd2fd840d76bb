//! The file layout of each image of `cargo xtask images` compared with what a real Dockerfile
//! builder makes of the same Dockerfile: `podman build` (buildah), offline.
//!
//! For each `deploy/docker/NAME.Dockerfile`, the final stage is given to `podman build`
//! verbatim (every `COPY --from`, `USER`, `WORKDIR`, `ENV`, `EXPOSE`, `ENTRYPOINT`, `CMD`
//! line as written), with two stand-ins, because this machine cannot download images:
//! - the base `gcr.io/distroless/cc-debian12:nonroot` is the archive's own base layer,
//!   imported with distroless' `USER`, `WORKDIR` and `ENV`;
//! - each stage a `COPY --from` names is `FROM scratch` holding what its `RUN` leaves in
//!   `/out` (as files of a build context): the `busybox-static` stage this machine's
//!   `/bin/busybox` with a symlink per applet of `busybox --list`, as its shell loop makes
//!   them; a `cargo build` stage one placeholder file per `--bin` at `/out/NAME`, mode 0755
//!   as `install -D` leaves it (the binaries' bytes are the build's, not the layout's).
//!
//! Both images are then flattened (layers applied in order, whiteouts honoured) and compared
//! entry by entry: path, type, permission bits, owner, symlink target, and the bytes of every
//! regular file except the placeholders (there: that the archive has an ELF file); and their
//! configs: `User`, `WorkingDir`, `Entrypoint`, `Cmd`, `Env`, `ExposedPorts`. Any difference
//! fails, listed.
//!
//! What this does not cover: the build stages' `RUN`s themselves (the `cargo build` inside
//! `rust:1.95-bookworm`, `apt-get install busybox-static`) and the real distroless base's
//! other files (tzdata, `os-release`, more libraries; see docs/kubernetes.md): those need
//! the registries, which this machine cannot reach.

use std::{
    collections::BTreeMap,
    io::Read,
    os::unix::fs::PermissionsExt,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    images_check::{read_archive, sha256},
    images_dockerfile::{self as dockerfile, StageKind},
    podman::Podman,
};

/// What a placeholder for a cargo stage's binary holds (`/out/NAME` appended).
const PLACEHOLDER: &str = "cargo xtask images: placeholder for the build stage's ";

/// One entry of a flattened image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `d` directory, `f` file, `l` symlink, `h` hard link, or the tar type byte.
    pub kind: char,
    /// Permission bits (with setuid, setgid and sticky).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// A link's target; a file's `sha256:` (or `placeholder /out/NAME`).
    pub what: String,
}

/// The layers and config of an archive in `docker save` form (`manifest.json`), which
/// both ours and `podman save --format docker-archive` write.
fn layers_and_config(archive: &Path) -> Result<(Vec<Vec<u8>>, Value, Vec<String>)> {
    let files = read_archive(archive)?;
    let manifest: Value = serde_json::from_slice(
        files
            .get("manifest.json")
            .with_context(|| format!("{}: no manifest.json", archive.display()))?,
    )?;
    let get = |path: &str| -> Result<&Vec<u8>> {
        files
            .get(path.trim_start_matches("./"))
            .with_context(|| format!("{}: {path} is missing", archive.display()))
    };
    let config: Value = serde_json::from_slice(get(manifest[0]["Config"]
        .as_str()
        .context("manifest.json without Config")?)?)?;
    let mut layers = Vec::new();
    for layer in manifest[0]["Layers"]
        .as_array()
        .context("manifest.json without Layers")?
    {
        let bytes = get(layer.as_str().context("a layer path is not a string")?)?;
        if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut tar = Vec::new();
            flate2::read::GzDecoder::new(bytes.as_slice()).read_to_end(&mut tar)?;
            layers.push(tar);
        } else {
            layers.push(bytes.clone());
        }
    }
    let history = config["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter(|e| e["empty_layer"] != true)
                .map(|e| e["created_by"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    Ok((layers, config, history))
}

/// A path of a layer tar, without `./`, leading or trailing `/`.
fn clean(raw: &str) -> String {
    raw.trim_start_matches("./")
        .trim_start_matches('/')
        .trim_end_matches('/')
        .to_owned()
}

/// Whether `p` is under the directory `dir` (everything is under the root, `""`).
fn under(dir: &str, p: &str) -> bool {
    dir.is_empty() || p.starts_with(&format!("{dir}/"))
}

/// The file system the layers make, applied in order: each layer's whiteouts remove what
/// the layers below it hold, then its entries are added.
pub fn flatten(layers: &[Vec<u8>]) -> Result<BTreeMap<String, Entry>> {
    let mut fs: BTreeMap<String, Entry> = BTreeMap::new();
    for tar in layers {
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries()? {
            let path = clean(&entry?.path()?.to_string_lossy());
            let (parent, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
            if name == ".wh..wh..opq" {
                fs.retain(|p, _| !under(parent, p));
            } else if let Some(gone) = name.strip_prefix(".wh.") {
                let gone = if parent.is_empty() {
                    gone.to_owned()
                } else {
                    format!("{parent}/{gone}")
                };
                fs.retain(|p, _| *p != gone && !under(&gone, p));
            }
        }
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = clean(&entry.path()?.to_string_lossy());
            let name = path.rsplit('/').next().unwrap_or_default();
            if path.is_empty() || path == "." || name.starts_with(".wh.") {
                continue;
            }
            let link = entry
                .link_name()?
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default();
            let (kind, what) = match entry.header().entry_type() {
                tar::EntryType::Directory => ('d', String::new()),
                tar::EntryType::Symlink => ('l', link),
                tar::EntryType::Link => ('h', clean(&link)),
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let mut bytes = Vec::new();
                    entry.read_to_end(&mut bytes)?;
                    let what = match std::str::from_utf8(&bytes)
                        .ok()
                        .and_then(|s| s.strip_prefix(PLACEHOLDER))
                    {
                        Some(out) => format!("placeholder {}", out.trim()),
                        None => sha256(&bytes),
                    };
                    ('f', what)
                }
                other => (char::from(other.as_byte()), String::new()),
            };
            let h = entry.header();
            let new = Entry {
                kind,
                mode: h.mode()? & 0o7777,
                uid: h.uid()?,
                gid: h.gid()?,
                what,
            };
            if kind != 'd' {
                // A file replaces a directory with everything under it.
                fs.retain(|p, _| !under(&path, p));
            }
            fs.insert(path, new);
        }
    }
    Ok(fs)
}

/// The differences between our image's file system and the one the builder made; a
/// placeholder of the builder's side matches any ELF file of ours with the same metadata.
pub fn differences(
    ours: &BTreeMap<String, Entry>,
    built: &BTreeMap<String, Entry>,
    elf: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let show = |e: &Entry| format!("{} {:04o} {}:{} {}", e.kind, e.mode, e.uid, e.gid, e.what);
    for (path, b) in built {
        match ours.get(path) {
            None => out.push(format!(
                "/{path}: only in the Dockerfile's image ({})",
                show(b)
            )),
            Some(o) => {
                let same_meta = (o.kind, o.mode, o.uid, o.gid) == (b.kind, b.mode, b.uid, b.gid);
                let same_what = o.what == b.what
                    || (b.what.starts_with("placeholder ") && o.kind == 'f' && elf(path));
                if !same_meta || !same_what {
                    out.push(format!(
                        "/{path}: ours {}, the Dockerfile's {}",
                        show(o),
                        show(b)
                    ));
                }
            }
        }
    }
    for (path, o) in ours {
        if !built.contains_key(path) {
            out.push(format!("/{path}: only in ours ({})", show(o)));
        }
    }
    out
}

/// The parts of an image config the Dockerfile decides (and the base's `Env`).
fn config_fields(config: &Value) -> Value {
    let c = &config["config"];
    let or_null = |v: &Value| match v {
        Value::Array(a) if a.is_empty() => Value::Null,
        Value::Object(o) if o.is_empty() => Value::Null,
        other => other.clone(),
    };
    serde_json::json!({
        "User": or_null(&c["User"]),
        "WorkingDir": or_null(&c["WorkingDir"]),
        "Entrypoint": or_null(&c["Entrypoint"]),
        "Cmd": or_null(&c["Cmd"]),
        // Sorted: the order of distinct variables means nothing, and builders may place a
        // variable an `ENV` sets again differently.
        "Env": or_null(&sorted(&c["Env"])),
        "ExposedPorts": or_null(&c["ExposedPorts"]),
    })
}

/// A JSON array sorted (strings), anything else as it is.
fn sorted(v: &Value) -> Value {
    match v.as_array() {
        Some(a) => {
            let mut a = a.clone();
            a.sort_by(|x, y| x.as_str().cmp(&y.as_str()));
            Value::Array(a)
        }
        None => v.clone(),
    }
}

/// Writes the build context of the stand-in stages; returns their Dockerfile text.
fn stand_in_stages(stages: &[(String, StageKind)], context: &Path) -> Result<String> {
    let mut text = String::new();
    for (name, kind) in stages {
        let out = context.join(name).join("out");
        std::fs::create_dir_all(&out)?;
        match kind {
            StageKind::Cargo { bins, .. } => {
                for bin in bins {
                    let file = out.join(bin);
                    std::fs::write(&file, format!("{PLACEHOLDER}/out/{bin}\n"))?;
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755))?;
                }
            }
            StageKind::Busybox => {
                let bin = out.join("bin");
                std::fs::create_dir_all(&bin)?;
                std::fs::copy("/bin/busybox", bin.join("busybox"))
                    .context("copying /bin/busybox (apt-get install busybox-static)")?;
                std::fs::set_permissions(
                    bin.join("busybox"),
                    std::fs::Permissions::from_mode(0o755),
                )?;
                let list = std::process::Command::new("/bin/busybox")
                    .arg("--list")
                    .output()
                    .context("running busybox --list")?;
                for applet in String::from_utf8_lossy(&list.stdout).lines() {
                    let applet = applet.trim();
                    if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
                        std::os::unix::fs::symlink("busybox", bin.join(applet))?;
                    }
                }
            }
        }
        for dir in [context.join(name), out.clone()] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        }
        text.push_str(&format!("FROM scratch AS {name}\nCOPY {name}/ /\n"));
    }
    Ok(text)
}

/// Compares the archive `dir/NAME.tar` of each Dockerfile with `podman build` of it.
pub fn compare(dir: &Path, podman: &Podman) -> Result<()> {
    let work = crate::target_dir().join("images-layout");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    for (name, path) in crate::images::dockerfiles()? {
        let t = Instant::now();
        let text = std::fs::read_to_string(&path)?;
        let spec = dockerfile::parse(&text).with_context(|| format!("{}", path.display()))?;
        let last = dockerfile::stages(&text)?
            .pop()
            .context("a Dockerfile without FROM")?;
        let archive = dir.join(format!("{name}.tar"));
        let (layers, config, history) = layers_and_config(&archive)?;
        ensure!(
            history
                .first()
                .is_some_and(|h| h.starts_with("cargo xtask images:")),
            "{}: the first layer is not the base `cargo xtask images` assembles",
            archive.display()
        );
        let context = work.join(&name);
        std::fs::create_dir_all(&context)?;
        std::fs::set_permissions(&context, std::fs::Permissions::from_mode(0o755))?;

        // The base: our base layer with distroless' settings.
        let base_ref = format!("localhost/jumpstarter-xtask-base:{name}");
        let base_tar = work.join(format!("{name}-base.tar"));
        std::fs::write(&base_tar, &layers[0])?;
        let env = [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        ];
        let mut args = vec!["import".to_owned()];
        for change in ["USER=65532", "WORKDIR=/home/nonroot"] {
            args.extend(["--change".to_owned(), change.to_owned()]);
        }
        for e in env {
            args.extend(["--change".to_owned(), format!("ENV={e}")]);
        }
        args.extend([base_tar.display().to_string(), base_ref.clone()]);
        podman.run(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            Duration::from_secs(120),
        )?;

        // The Dockerfile: stand-in stages, then the final stage as written.
        let mut file = stand_in_stages(&spec.stages, &context)?;
        file.push_str(&format!("FROM {base_ref}\n"));
        for line in text.lines().skip(last.line) {
            file.push_str(line);
            file.push('\n');
        }
        std::fs::write(context.join("Dockerfile"), &file)?;
        let built_ref = format!("localhost/jumpstarter-xtask-built:{name}");
        let built_tar = work.join(format!("{name}-built.tar"));
        let result = (|| -> Result<()> {
            podman.run(
                &[
                    "build",
                    "--pull=never",
                    "--network=none",
                    "--quiet",
                    "--file",
                    &context.join("Dockerfile").display().to_string(),
                    "--tag",
                    &built_ref,
                    &context.display().to_string(),
                ],
                Duration::from_secs(300),
            )?;
            podman.run(
                &[
                    "save",
                    "--format",
                    "docker-archive",
                    "--output",
                    &built_tar.display().to_string(),
                    &built_ref,
                ],
                Duration::from_secs(120),
            )?;
            Ok(())
        })();
        let _ = podman.run(
            &["rmi", "--force", &built_ref, &base_ref],
            Duration::from_secs(60),
        );
        result.with_context(|| format!("podman build of {}", path.display()))?;
        let (built_layers, built_config, _) = layers_and_config(&built_tar)?;

        let ours = flatten(&layers)?;
        let built = flatten(&built_layers)?;
        let elf = |p: &str| ours_file_is_elf(&layers, p).unwrap_or(false);
        let mut diffs = differences(&ours, &built, &elf);
        let (a, b) = (config_fields(&config), config_fields(&built_config));
        if a != b {
            diffs.push(format!("config: ours {a}, the Dockerfile's {b}"));
        }
        if !diffs.is_empty() {
            let n = diffs.len();
            diffs.truncate(40);
            bail!(
                "{} and podman build of {} differ ({n} differences; the Dockerfile podman built \
                 is {}):\n{}",
                archive.display(),
                path.display(),
                context.join("Dockerfile").display(),
                diffs.join("\n")
            );
        }
        println!(
            "   {name}: same layout as podman build of {} ({} entries, config): {:.1}s",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            ours.len(),
            t.elapsed().as_secs_f64()
        );
    }
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Whether the last layer of ours that holds `path` holds an ELF file there.
fn ours_file_is_elf(layers: &[Vec<u8>], path: &str) -> Result<bool> {
    let mut found = false;
    for tar in layers {
        let mut archive = tar::Archive::new(tar.as_slice());
        for entry in archive.entries()? {
            let mut entry = entry?;
            let p = entry.path()?.to_string_lossy().into_owned();
            if p.trim_start_matches("./").trim_start_matches('/') == path {
                let mut head = [0u8; 4];
                found = entry.read_exact(&mut head).is_ok() && head == *b"\x7fELF";
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::{Kind, Node, layer_tar};

    fn node(path: &str, kind: Kind, mode: u32) -> Node {
        Node {
            path: path.into(),
            kind,
            mode,
            uid: 0,
            gid: 0,
        }
    }

    #[test]
    fn configs_compare_what_the_dockerfile_decides() {
        let a = serde_json::json!({"config": {"User": "65532:65532", "Env": ["B=2", "A=1"],
            "ExposedPorts": {}, "Labels": {"io.buildah.version": "1"}}});
        let b = serde_json::json!({"config": {"User": "65532:65532", "Env": ["A=1", "B=2"]}});
        assert_eq!(config_fields(&a), config_fields(&b));
        let c = serde_json::json!({"config": {"User": "65532", "Env": ["A=1", "B=2"]}});
        assert_ne!(config_fields(&b), config_fields(&c));
    }

    #[test]
    fn layers_flatten_with_whiteouts_and_differences_are_listed() -> Result<()> {
        let file = |p: &str, b: &[u8]| {
            node(
                p,
                Kind::File(crate::images::Content::Bytes(b.to_vec())),
                0o644,
            )
        };
        let lower = layer_tar(&[
            file("/etc/a", b"a"),
            file("/opt/x/y", b"y"),
            file("/gone", b"g"),
        ])?;
        let upper = layer_tar(&[
            file("/opt/x/.wh..wh..opq", b""),
            file("/.wh.gone", b""),
            node("/bin/sh", Kind::Symlink("busybox".into()), 0o777),
        ])?;
        let fs = flatten(&[lower.clone(), upper])?;
        let paths: Vec<&str> = fs.keys().map(String::as_str).collect();
        assert_eq!(paths, ["bin", "bin/sh", "etc", "etc/a", "opt", "opt/x"]);
        assert_eq!(fs["bin/sh"].what, "busybox");

        let other = flatten(&[layer_tar(&[
            node(
                "/etc/a",
                Kind::File(crate::images::Content::Bytes(b"b".to_vec())),
                0o600,
            ),
            file(
                "/usr/local/bin/x",
                format!("{PLACEHOLDER}/out/x\n").as_bytes(),
            ),
        ])?])?;
        assert_eq!(other["usr/local/bin/x"].what, "placeholder /out/x");
        let ours = flatten(&[layer_tar(&[
            file("/etc/a", b"a"),
            file("/usr/local/bin/x", b"\x7fELF..."),
        ])?])?;
        let diffs = differences(&ours, &other, &|_| true);
        assert_eq!(diffs.len(), 1, "{diffs:?}");
        assert!(diffs[0].starts_with("/etc/a: ours f 0644"), "{diffs:?}");
        assert!(differences(&ours, &other, &|_| false).len() == 2);
        let missing = differences(&fs, &ours, &|_| true);
        assert!(missing.iter().any(|d| d.contains("/bin/sh: only in ours")));
        assert!(
            missing
                .iter()
                .any(|d| d.contains("/usr/local/bin/x: only in the Dockerfile's"))
        );
        Ok(())
    }
}
