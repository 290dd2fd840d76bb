//! `cargo xtask images [--out DIR] [--tag TAG]`: the container images of
//! `deploy/docker/*.Dockerfile`, built without a container engine.
//!
//! For each Dockerfile the final stage is read ([`crate::images_dockerfile`]); the release
//! binaries come from the benchmarks' release build ([`crate::bench::build_release`]), the
//! distroless base (`gcr.io/distroless/cc-debian12:nonroot`, not downloadable here) is
//! assembled from this machine's files: the shared libraries `ldd` names and the ELF
//! interpreter, `/etc/passwd` and `/etc/group` with `nonroot` (65532), the CA bundle, `/tmp`
//! and `/home/nonroot`. Each image is written as one tar that is both an OCI image layout
//! (`oci-layout`, `index.json`, `blobs/sha256/`) and a `docker save` archive
//! (`manifest.json`), as `docker save` writes since Docker 25: `docker load`, `podman load`,
//! `kind load image-archive` and `skopeo copy oci-archive:` accept it. Layers: the base, then
//! one per COPY, gzip, every timestamp 0 (the same inputs give the same digests). Then each
//! image is checked ([`crate::images_check`]).

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{
    images_check::sha256,
    images_dockerfile::{self as dockerfile, CopyFrom, ImageSpec, StageKind},
};

/// The user `nonroot` of the distroless images.
pub const NONROOT: u64 = 65532;

/// What one file of a layer holds.
pub enum Content {
    /// Bytes made here.
    Bytes(Vec<u8>),
    /// A file of this machine.
    File(PathBuf),
}

/// One entry of a layer.
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File(Content),
    /// A symbolic link to the target.
    Symlink(String),
}

/// An entry of a layer at an absolute path.
pub struct Node {
    /// Absolute path in the image.
    pub path: String,
    /// What it is.
    pub kind: Kind,
    /// Permission bits (with sticky/setuid bits).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
}

impl Node {
    fn dir(path: &str, mode: u32, owner: u64) -> Self {
        Self {
            path: path.to_owned(),
            kind: Kind::Dir,
            mode,
            uid: owner,
            gid: owner,
        }
    }
    fn bytes(path: &str, bytes: &[u8]) -> Self {
        Self {
            path: path.to_owned(),
            kind: Kind::File(Content::Bytes(bytes.to_vec())),
            mode: 0o644,
            uid: 0,
            gid: 0,
        }
    }
    fn file(path: &str, from: PathBuf, mode: u32) -> Self {
        Self {
            path: path.to_owned(),
            kind: Kind::File(Content::File(from)),
            mode,
            uid: 0,
            gid: 0,
        }
    }
}

/// A layer as written: its gzip blob, and the digests of that blob and of the tar in it.
pub struct Layer {
    /// The gzip-compressed tar.
    pub blob: Vec<u8>,
    /// `sha256:` of the blob.
    pub digest: String,
    /// `sha256:` of the uncompressed tar (the config's `diff_ids`).
    pub diff_id: String,
    /// What made it (the config's history).
    pub created_by: String,
}

/// The tar of `nodes`, parent directories first (root-owned, 0755, unless a node names them),
/// every timestamp 0.
pub fn layer_tar(nodes: &[Node]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Complete);
    let mut dirs: BTreeSet<String> = BTreeSet::new();
    let explicit: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| matches!(n.kind, Kind::Dir))
        .map(|n| n.path.trim_end_matches('/'))
        .collect();
    for node in nodes {
        let rel = node.path.trim_start_matches('/').trim_end_matches('/');
        if rel.is_empty()
            || rel
                .split('/')
                .any(|p| p == ".." || p == "." || p.is_empty())
        {
            bail!("layer path {:?} is not a clean absolute path", node.path);
        }
        let parts: Vec<&str> = rel.split('/').collect();
        for i in 1..parts.len() {
            let parent = parts[..i].join("/");
            if !dirs.contains(&parent) && !explicit.contains(format!("/{parent}").as_str()) {
                append(&mut builder, &Node::dir(&parent, 0o755, 0), &parent)?;
                dirs.insert(parent);
            }
        }
        if matches!(node.kind, Kind::Dir) {
            if !dirs.insert(rel.to_owned()) {
                continue;
            }
        } else if dirs.contains(rel) {
            bail!("{} is both a directory and a file", node.path);
        }
        append(&mut builder, node, rel)?;
    }
    Ok(builder.into_inner()?)
}

fn append(builder: &mut tar::Builder<Vec<u8>>, node: &Node, rel: &str) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_mode(node.mode);
    h.set_uid(node.uid);
    h.set_gid(node.gid);
    h.set_mtime(0);
    match &node.kind {
        Kind::Dir => {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            builder.append_data(&mut h, format!("{rel}/"), std::io::empty())?;
        }
        Kind::Symlink(target) => {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            builder.append_link(&mut h, rel, target)?;
        }
        Kind::File(Content::Bytes(bytes)) => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(bytes.len() as u64);
            builder.append_data(&mut h, rel, bytes.as_slice())?;
        }
        Kind::File(Content::File(path)) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(file.metadata()?.len());
            builder
                .append_data(&mut h, rel, file)
                .with_context(|| format!("adding {}", path.display()))?;
        }
    }
    Ok(())
}

/// Builds, compresses and digests one layer.
pub fn layer(nodes: &[Node], created_by: String) -> Result<Layer> {
    let tar = layer_tar(nodes)?;
    let diff_id = sha256(&tar);
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    gz.write_all(&tar)?;
    let blob = gz.finish()?;
    Ok(Layer {
        digest: sha256(&blob),
        diff_id,
        blob,
        created_by,
    })
}

/// The ELF interpreter (`PT_INTERP`) of a 64-bit little-endian ELF file; `None` for a static
/// executable; an error for anything else.
pub fn elf_interpreter(bytes: &[u8]) -> Result<Option<String>> {
    let u16_at = |o: usize| -> Option<u16> {
        Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?))
    };
    let u32_at = |o: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?))
    };
    let u64_at = |o: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?)).ok()
    };
    if bytes.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let (phoff, phentsize, phnum) = (|| Some((u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?)))()
        .context("truncated ELF header")?;
    for i in 0..usize::from(phnum) {
        let ph = phoff + i * usize::from(phentsize);
        if u32_at(ph).context("truncated program header")? != 3 {
            continue;
        }
        let (offset, size) =
            (|| Some((u64_at(ph + 8)?, u64_at(ph + 32)?)))().context("truncated PT_INTERP")?;
        let raw = bytes
            .get(offset..offset + size)
            .context("PT_INTERP out of the file")?;
        let path = String::from_utf8_lossy(raw)
            .trim_end_matches('\0')
            .to_owned();
        return Ok(Some(path));
    }
    Ok(None)
}

/// The shared libraries `ldd` resolves for `binary`, as (path in the image, file here).
fn shared_libraries(binary: &Path) -> Result<Vec<(String, PathBuf)>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd (libc-bin)")?;
    if !out.status.success() {
        bail!(
            "ldd {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, rest)) = line.trim().split_once(" => ") else {
            continue; // the vDSO and the interpreter (taken from PT_INTERP)
        };
        let path = rest.split(" (").next().unwrap_or_default().trim();
        if !path.starts_with('/') {
            bail!("ldd {}: {name} => {rest}", binary.display());
        }
        libs.push((path.to_owned(), PathBuf::from(path)));
    }
    Ok(libs)
}

/// The files of the distroless `cc-debian12:nonroot` base this image needs: the interpreter
/// and libraries of its dynamically linked `binaries` (host files), users, groups and CA
/// certificates.
fn base_nodes(binaries: &[PathBuf]) -> Result<Vec<Node>> {
    let mut nodes = vec![
        Node::dir("/etc", 0o755, 0),
        Node::bytes(
            "/etc/passwd",
            b"root:x:0:0:root:/root:/sbin/nologin\n\
              nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
              nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        ),
        Node::bytes(
            "/etc/group",
            b"root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n",
        ),
        Node::bytes(
            "/etc/nsswitch.conf",
            b"passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
              protocols: files\nservices: files\n",
        ),
        Node::dir("/home", 0o755, 0),
        Node::dir("/home/nonroot", 0o700, NONROOT),
        Node::dir("/root", 0o700, 0),
        Node::dir("/tmp", 0o1777, 0),
    ];
    let certs = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if !certs.is_file() {
        bail!(
            "{} is missing (apt-get install ca-certificates)",
            certs.display()
        );
    }
    nodes.push(Node::file(
        "/etc/ssl/certs/ca-certificates.crt",
        certs.into(),
        0o644,
    ));
    let mut seen = BTreeSet::new();
    for binary in binaries {
        let bytes = std::fs::read(binary).with_context(|| format!("{}", binary.display()))?;
        let Some(interp) =
            elf_interpreter(&bytes).with_context(|| format!("{}", binary.display()))?
        else {
            continue;
        };
        let mut files = vec![(interp.clone(), PathBuf::from(&interp))];
        files.extend(shared_libraries(binary)?);
        for (in_image, here) in files {
            if seen.insert(in_image.clone()) {
                let real =
                    std::fs::canonicalize(&here).with_context(|| format!("{}", here.display()))?;
                nodes.push(Node::file(&in_image, real, 0o755));
            }
        }
    }
    Ok(nodes)
}

/// Where a COPY's files come from, resolved to files here (release binaries already staged).
fn copy_nodes(
    copy: &CopyFrom,
    kind: &StageKind,
    staged: &Path,
    busybox: &Path,
) -> Result<Vec<Node>> {
    let into_dir = copy.dest.ends_with('/') || copy.sources.len() > 1;
    let mut nodes = Vec::new();
    for source in &copy.sources {
        match kind {
            StageKind::Cargo { bins, .. } => {
                let bin = source
                    .strip_prefix("/out/")
                    .filter(|b| bins.iter().any(|x| x == b))
                    .with_context(|| {
                        format!(
                            "line {}: COPY --from={} {source}: that stage makes only {}",
                            copy.line,
                            copy.stage,
                            bins.iter()
                                .map(|b| format!("/out/{b}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })?;
                let dest = if into_dir {
                    format!("{}/{bin}", copy.dest.trim_end_matches('/'))
                } else {
                    copy.dest.clone()
                };
                nodes.push(Node::file(&dest, staged.join(bin), 0o755));
            }
            StageKind::Busybox => {
                if source.trim_end_matches('/') != "/out/bin" || !copy.dest.ends_with('/') {
                    bail!(
                        "line {}: COPY --from={} {source} {}: that stage makes /out/bin/, \
                         copied into a directory (DEST ending with /)",
                        copy.line,
                        copy.stage,
                        copy.dest
                    );
                }
                let dir = copy.dest.trim_end_matches('/');
                nodes.push(Node::file(
                    &format!("{dir}/busybox"),
                    busybox.to_path_buf(),
                    0o755,
                ));
                let list = Command::new(busybox)
                    .arg("--list")
                    .output()
                    .with_context(|| format!("{} --list", busybox.display()))?;
                for applet in String::from_utf8_lossy(&list.stdout).lines() {
                    let applet = applet.trim();
                    if applet.is_empty() || applet == "busybox" || applet.contains('/') {
                        continue;
                    }
                    nodes.push(Node {
                        path: format!("{dir}/{applet}"),
                        kind: Kind::Symlink("busybox".into()),
                        mode: 0o777,
                        uid: 0,
                        gid: 0,
                    });
                }
            }
        }
    }
    Ok(nodes)
}

/// The `GOARCH`-style name of this machine's architecture.
fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// One image archive written.
pub struct Built {
    /// The archive.
    pub archive: PathBuf,
    /// `name:tag`.
    pub reference: String,
    /// The image paths of the binaries from cargo stages (each is run with `--help`).
    pub binaries: Vec<String>,
}

/// Assembles the image of one Dockerfile into `out/NAME.tar`.
fn build_one(name: &str, spec: &ImageSpec, tag: &str, release: &Path, out: &Path) -> Result<Built> {
    let staged = out.join(format!(".staged-{name}"));
    if staged.exists() {
        std::fs::remove_dir_all(&staged)?;
    }
    std::fs::create_dir_all(&staged)?;
    let busybox = PathBuf::from("/bin/busybox");
    let mut elf_inputs = Vec::new();
    for (stage, kind) in &spec.stages {
        match kind {
            StageKind::Cargo {
                packages,
                bins,
                strip,
            } => {
                if let Some(p) = packages
                    .iter()
                    .find(|p| !crate::bench::RELEASE_PACKAGES.contains(&p.as_str()))
                {
                    bail!(
                        "stage {stage} builds -p {p}, which the release build of \
                         bench::build_release does not"
                    );
                }
                for bin in bins {
                    let from = release.join(bin);
                    let to = staged.join(bin);
                    if *strip {
                        let status = Command::new("strip")
                            .arg("--strip-debug")
                            .arg("-o")
                            .arg(&to)
                            .arg(&from)
                            .status()
                            .context("running strip (binutils)")?;
                        if !status.success() {
                            bail!("strip --strip-debug {} failed", from.display());
                        }
                    } else {
                        std::fs::copy(&from, &to)
                            .with_context(|| format!("copying {}", from.display()))?;
                    }
                    elf_inputs.push(to);
                }
            }
            StageKind::Busybox => {
                let bytes = std::fs::read(&busybox).with_context(|| {
                    format!(
                        "stage {stage}: {} is missing (apt-get install busybox-static)",
                        busybox.display()
                    )
                })?;
                if elf_interpreter(&bytes)?.is_some() {
                    bail!(
                        "stage {stage}: {} is dynamically linked; install busybox-static",
                        busybox.display()
                    );
                }
            }
        }
    }
    let mut layers = vec![layer(
        &base_nodes(&elf_inputs)?,
        format!(
            "cargo xtask images: {} assembled from this machine's files (ELF interpreter, \
             shared libraries, CA certificates, passwd/group with nonroot 65532)",
            spec.base
        ),
    )?];
    let mut binaries = Vec::new();
    for copy in &spec.copies {
        let kind = spec
            .stages
            .iter()
            .find(|(n, _)| *n == copy.stage)
            .map(|(_, k)| k)
            .context("stage of a COPY")?;
        let nodes = copy_nodes(copy, kind, &staged, &busybox)?;
        if matches!(kind, StageKind::Cargo { .. }) {
            binaries.extend(nodes.iter().map(|n| n.path.clone()));
        }
        layers.push(layer(
            &nodes,
            format!(
                "COPY --from={} {} {}",
                copy.stage,
                copy.sources.join(" "),
                copy.dest
            ),
        )?);
    }
    std::fs::remove_dir_all(&staged)?;

    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        (
            "SSL_CERT_FILE".into(),
            "/etc/ssl/certs/ca-certificates.crt".into(),
        ),
    ];
    for (k, v) in &spec.env {
        env.retain(|(key, _)| key != k);
        env.push((k.clone(), v.clone()));
    }
    let mut config = json!({
        "User": spec.user.clone().unwrap_or_else(|| NONROOT.to_string()),
        "Env": env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "Entrypoint": spec.entrypoint,
        "WorkingDir": spec.workdir.clone().unwrap_or_else(|| "/home/nonroot".into()),
    });
    if let Some(cmd) = &spec.cmd {
        config["Cmd"] = json!(cmd);
    }
    if !spec.exposed.is_empty() {
        let ports: serde_json::Map<String, Value> = spec
            .exposed
            .iter()
            .map(|p| (p.clone(), json!({})))
            .collect();
        config["ExposedPorts"] = Value::Object(ports);
    }
    let image_config = json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": oci_architecture(),
        "os": "linux",
        "config": config,
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        },
        "history": layers.iter().map(|l| json!({
            "created": "1970-01-01T00:00:00Z",
            "created_by": l.created_by,
        })).collect::<Vec<_>>(),
    });
    let config_bytes = serde_json::to_vec(&image_config)?;
    let config_digest = sha256(&config_bytes);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_bytes.len(),
        },
        "layers": layers.iter().map(|l| json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": l.digest,
            "size": l.blob.len(),
        })).collect::<Vec<_>>(),
    });
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let manifest_digest = sha256(&manifest_bytes);
    let reference = format!("{name}:{tag}");
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_bytes.len(),
            "annotations": {
                "io.containerd.image.name": format!("docker.io/library/{reference}"),
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    let blob_path = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    let docker_manifest = json!([{
        "Config": blob_path(&config_digest),
        "RepoTags": [reference],
        "Layers": layers.iter().map(|l| blob_path(&l.digest)).collect::<Vec<_>>(),
    }]);

    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".into(), serde_json::to_vec(&index)?),
        (
            "manifest.json".into(),
            serde_json::to_vec(&docker_manifest)?,
        ),
        (blob_path(&config_digest), config_bytes),
        (blob_path(&manifest_digest), manifest_bytes),
    ];
    for l in layers {
        files.push((blob_path(&l.digest), l.blob));
    }
    let mut archive = tar::Builder::new(Vec::new());
    for dir in ["blobs", "blobs/sha256"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_size(0);
        archive.append_data(&mut h, format!("{dir}/"), std::io::empty())?;
    }
    let mut written = BTreeSet::new();
    for (path, bytes) in &files {
        if !written.insert(path.clone()) {
            continue; // the same blob twice (two identical layers)
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_size(bytes.len() as u64);
        archive.append_data(&mut h, path, bytes.as_slice())?;
    }
    let bytes = archive.into_inner()?;
    let path = out.join(format!("{name}.tar"));
    let partial = out.join(format!(".{name}.tar.partial"));
    std::fs::write(&partial, &bytes)?;
    std::fs::rename(&partial, &path)?;
    Ok(Built {
        archive: path,
        reference,
        binaries,
    })
}

/// The Dockerfiles of `deploy/docker`, by image name (the file name without `.Dockerfile`).
pub fn dockerfiles() -> Result<Vec<(String, PathBuf)>> {
    let dir = crate::workspace_root().join("deploy/docker");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".Dockerfile"))
            .map(str::to_owned);
        if let Some(name) = name {
            out.push((name, path));
        }
    }
    out.sort();
    if out.is_empty() {
        bail!("no *.Dockerfile in {}", dir.display());
    }
    Ok(out)
}

/// Runs `cargo xtask images`.
pub fn run(args: &[String]) -> Result<()> {
    let (mut out, mut tag) = (None, None);
    let mut debug = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let slot = match arg.as_str() {
            "--out" => &mut out,
            "--tag" => &mut tag,
            "--debug" => {
                debug = true;
                continue;
            }
            other => bail!(
                "cargo xtask images [--out DIR] [--tag TAG] [--debug]: unknown argument {other}"
            ),
        };
        *slot = Some(
            rest.next()
                .cloned()
                .with_context(|| format!("{arg} needs a value"))?,
        );
    }
    let out = out
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::target_dir().join("images"));
    let tag = tag.unwrap_or_else(|| "dev".into());
    // Read every Dockerfile before the (long) build, so a refused instruction fails at once.
    let mut specs = Vec::new();
    for (name, path) in dockerfiles()? {
        let text = std::fs::read_to_string(&path)?;
        let spec = dockerfile::parse(&text).with_context(|| format!("{}", path.display()))?;
        specs.push((name, spec));
    }
    let started = Instant::now();
    // `--debug` (what `cargo xtask ci` uses): the debug binaries the tests built, so CI
    // checks the images without a release build of its own; they are larger, not different.
    let release = if debug {
        crate::debug_build()?
    } else {
        crate::bench::build_release()?
    };
    println!(
        "{} build: {:.1} s",
        if debug { "debug" } else { "release" },
        started.elapsed().as_secs_f64()
    );
    std::fs::create_dir_all(&out)?;
    for (name, spec) in &specs {
        let t = Instant::now();
        let built = build_one(name, spec, &tag, &release, &out)?;
        let size = std::fs::metadata(&built.archive)?.len();
        println!(
            "{}: {} ({:.1} MB) in {:.1} s",
            built.reference,
            built.archive.display(),
            size as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
        let t = Instant::now();
        crate::images_check::check(&built.archive, &built.binaries)
            .with_context(|| format!("checking {}", built.archive.display()))?;
        println!("  checked in {:.1} s", t.elapsed().as_secs_f64());
    }
    println!(
        "load with: docker load -i FILE | podman load -i FILE | kind load image-archive FILE \
         (files in {})",
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_reproducible_and_list_parents_first() -> Result<()> {
        let nodes = || {
            vec![
                Node::bytes("/usr/local/bin/x", b"#!x"),
                Node::dir("/home/nonroot", 0o700, NONROOT),
                Node {
                    path: "/bin/sh".into(),
                    kind: Kind::Symlink("busybox".into()),
                    mode: 0o777,
                    uid: 0,
                    gid: 0,
                },
            ]
        };
        let a = layer(&nodes(), "a".into())?;
        let b = layer(&nodes(), "b".into())?;
        assert_eq!(
            (a.digest.as_str(), a.diff_id.as_str()),
            (b.digest.as_str(), b.diff_id.as_str())
        );
        let tar = layer_tar(&nodes())?;
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries()? {
            let entry = entry?;
            let h = entry.header();
            seen.push((
                entry.path()?.to_string_lossy().into_owned(),
                h.uid()?,
                h.mode()?,
                h.mtime()?,
            ));
        }
        assert_eq!(
            seen,
            [
                ("usr/".to_owned(), 0, 0o755, 0),
                ("usr/local/".to_owned(), 0, 0o755, 0),
                ("usr/local/bin/".to_owned(), 0, 0o755, 0),
                ("usr/local/bin/x".to_owned(), 0, 0o644, 0),
                ("home/".to_owned(), 0, 0o755, 0),
                ("home/nonroot/".to_owned(), NONROOT, 0o700, 0),
                ("bin/".to_owned(), 0, 0o755, 0),
                ("bin/sh".to_owned(), 0, 0o777, 0),
            ]
        );
        assert!(layer_tar(&[Node::bytes("/a/../b", b"")]).is_err());
        Ok(())
    }

    #[test]
    fn the_interpreter_of_this_test_binary_is_found() -> Result<()> {
        let exe = std::fs::read(std::env::current_exe()?)?;
        let interp = elf_interpreter(&exe)?;
        // Linked dynamically against glibc by default on Linux.
        assert!(interp.is_some_and(|i| i.starts_with('/') && i.contains("ld-")));
        assert!(elf_interpreter(b"#!/bin/sh\n").is_err());
        Ok(())
    }
}
