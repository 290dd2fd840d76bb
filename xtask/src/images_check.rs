//! The checks of an image archive `cargo xtask images` wrote, from the archive alone: the
//! OCI layout and the `docker save` manifest agree, every blob has the digest and size its
//! descriptor says, the config's `diff_ids` are the digests of the uncompressed layers; the
//! layers unpacked in order into a temporary root file system hold the entrypoint (a file the
//! image's user may execute), the user in `/etc/passwd` and the working directory; and each
//! binary prints its `--help` inside that root (`chroot` as the image's user when we are
//! root, else `unshare --map-root-user --root`), and so does the shell when there is one.

use std::{
    collections::HashMap,
    io::Read,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use sha2::{Digest, Sha256};

/// `sha256:HEX`.
pub fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Binaries that refuse to run outside `jmp shell` (no `JUMPSTARTER_HOST`), with the start of
/// their error, which shows they started.
const ONLY_IN_A_SHELL: &[(&str, &str)] = &[("j", "must be used inside a jmp shell")];

/// Every regular file of a tar, by path.
pub fn read_archive(path: &Path) -> Result<HashMap<String, Vec<u8>>> {
    let file = std::fs::File::open(path)?;
    let mut archive = tar::Archive::new(file);
    let mut files = HashMap::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        files.insert(name, bytes);
    }
    Ok(files)
}

/// A blob named by a descriptor, after checking its digest and size.
fn blob<'a>(files: &'a HashMap<String, Vec<u8>>, descriptor: &Value) -> Result<&'a [u8]> {
    let digest = descriptor["digest"]
        .as_str()
        .context("descriptor without digest")?;
    let size = descriptor["size"]
        .as_u64()
        .context("descriptor without size")?;
    let hex = digest
        .strip_prefix("sha256:")
        .context("digest not sha256")?;
    let bytes = files
        .get(&format!("blobs/sha256/{hex}"))
        .with_context(|| format!("blob {digest} missing"))?;
    if sha256(bytes) != digest {
        bail!("blob {digest} has digest {}", sha256(bytes));
    }
    if bytes.len() as u64 != size {
        bail!(
            "blob {digest} is {} bytes, its descriptor says {size}",
            bytes.len()
        );
    }
    Ok(bytes)
}

/// Whether we are root (the owner of our `/proc/self`).
fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Checks one archive; `binaries` (paths in the image) are each run with `--help`.
pub fn check(archive: &Path, binaries: &[String]) -> Result<()> {
    let files = read_archive(archive)?;
    let layout: Value = serde_json::from_slice(files.get("oci-layout").context("no oci-layout")?)?;
    if layout["imageLayoutVersion"] != "1.0.0" {
        bail!("oci-layout: {layout}");
    }
    let index: Value = serde_json::from_slice(files.get("index.json").context("no index.json")?)?;
    let [descriptor] = index["manifests"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    else {
        bail!("index.json does not name exactly one manifest");
    };
    let manifest: Value = serde_json::from_slice(blob(&files, descriptor)?)?;
    if manifest["mediaType"] != "application/vnd.oci.image.manifest.v1+json" {
        bail!("manifest media type {}", manifest["mediaType"]);
    }
    let config: Value = serde_json::from_slice(blob(&files, &manifest["config"])?)?;
    let layers = manifest["layers"]
        .as_array()
        .context("manifest without layers")?;
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .context("config without diff_ids")?;
    if layers.len() != diff_ids.len() || layers.is_empty() {
        bail!("{} layers but {} diff_ids", layers.len(), diff_ids.len());
    }
    // `docker load` reads manifest.json: the same config and layers.
    let docker: Value =
        serde_json::from_slice(files.get("manifest.json").context("no manifest.json")?)?;
    let path_of = |d: &Value| {
        format!(
            "blobs/sha256/{}",
            d["digest"]
                .as_str()
                .unwrap_or_default()
                .trim_start_matches("sha256:")
        )
    };
    let expected = serde_json::json!([{
        "Config": path_of(&manifest["config"]),
        "RepoTags": docker[0]["RepoTags"],
        "Layers": layers.iter().map(path_of).collect::<Vec<_>>(),
    }]);
    if docker != expected || docker[0]["RepoTags"].as_array().is_none_or(Vec::is_empty) {
        bail!("manifest.json {docker} does not match the OCI manifest ({expected})");
    }

    let root_dir = crate::interop::tempfile_dir::Dir::new_in(
        archive.parent().unwrap_or(Path::new(".")),
        ".rootfs",
    )?;
    let root = root_dir.path();
    let as_root = is_root();
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        if layer["mediaType"] != "application/vnd.oci.image.layer.v1.tar+gzip" {
            bail!("layer media type {}", layer["mediaType"]);
        }
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(blob(&files, layer)?).read_to_end(&mut tar)?;
        if Some(sha256(&tar).as_str()) != diff_id.as_str() {
            bail!(
                "layer {} does not uncompress to diff_id {diff_id}",
                layer["digest"]
            );
        }
        let mut unpack = tar::Archive::new(tar.as_slice());
        for entry in unpack.entries()? {
            let entry = entry?;
            let path = entry.path()?.to_string_lossy().into_owned();
            if path
                .rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with(".wh."))
            {
                bail!("whiteout {path}: not expected in these images");
            }
        }
        let mut unpack = tar::Archive::new(tar.as_slice());
        unpack.set_preserve_permissions(true);
        unpack.set_preserve_ownerships(as_root);
        unpack.unpack(root)?;
    }

    let cfg = &config["config"];
    let user = cfg["User"].as_str().context("config without User")?;
    let (uid, gid) = match user.split_once(':') {
        Some((u, g)) => (u.parse::<u32>()?, g.parse::<u32>()?),
        None => (user.parse::<u32>()?, user.parse::<u32>()?),
    };
    let passwd = std::fs::read_to_string(root.join("etc/passwd"))?;
    let home = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&uid.to_string().as_str()))
        .and_then(|f| f.get(5).map(|h| (*h).to_owned()))
        .with_context(|| format!("user {uid} is not in /etc/passwd"))?;
    let workdir = cfg["WorkingDir"]
        .as_str()
        .context("config without WorkingDir")?;
    if !root.join(workdir.trim_start_matches('/')).is_dir() {
        bail!("WorkingDir {workdir} is not a directory in the image");
    }
    let entrypoint: Vec<String> = serde_json::from_value(cfg["Entrypoint"].clone())?;
    let first = entrypoint.first().context("empty Entrypoint")?;
    let mut to_run: Vec<String> = binaries.to_vec();
    if !to_run.contains(first) {
        to_run.insert(0, first.clone());
    }
    for path in &to_run {
        let meta = std::fs::metadata(root.join(path.trim_start_matches('/')))
            .with_context(|| format!("{path} is not in the image"))?;
        let mode = meta.permissions().mode();
        let bit = if as_root && meta.uid() == uid {
            0o100
        } else if as_root && meta.gid() == gid {
            0o010
        } else {
            0o001
        };
        if !meta.is_file() || (as_root && mode & bit == 0) || mode & 0o111 == 0 {
            bail!("{path} is not a file user {user} may execute (mode {mode:o})");
        }
    }
    let env: Vec<String> = serde_json::from_value(cfg["Env"].clone())?;
    let mut env: Vec<(String, String)> = env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    env.push(("HOME".into(), home));
    let run_inside = |argv: &[&str]| -> Result<String> {
        let mut cmd;
        if as_root {
            cmd = Command::new("chroot");
            cmd.arg(format!("--userspec={uid}:{gid}")).arg(root);
        } else {
            cmd = Command::new("unshare");
            cmd.arg("--map-root-user")
                .arg(format!("--root={}", root.display()));
        }
        cmd.args(argv)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)));
        let out = crate::procs::run(cmd, Duration::from_secs(60))?;
        if out.code != 0 {
            if !as_root && out.stderr.starts_with("unshare:") {
                bail!(
                    "cannot run the image's binaries: not root, and `unshare --map-root-user` \
                     failed ({}); run as root (chroot) or enable user namespaces",
                    out.stderr.trim()
                );
            }
            bail!(
                "{argv:?} inside the image exited with {}: {}{}",
                out.code,
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    };
    for path in &to_run {
        let name = path.rsplit('/').next().unwrap_or(path);
        if let Some((_, expected)) = ONLY_IN_A_SHELL.iter().find(|(n, _)| *n == name) {
            // It starts, loads its libraries and answers with its own error.
            match run_inside(&[path, "--help"]) {
                Err(e) if format!("{e:#}").contains(expected) => {
                    println!("  {path} --help: starts (outside `jmp shell` it says {expected:?})");
                    continue;
                }
                Err(e) => return Err(e),
                Ok(out) => bail!("{path} --help outside a jmp shell succeeded: {out}"),
            }
        }
        let help = run_inside(&[path, "--help"])?;
        if !help.contains("Usage:") {
            bail!("{path} --help inside the image printed no usage: {help}");
        }
        println!("  {path} --help: ok ({} lines)", help.lines().count());
    }
    if root.join("bin/sh").exists() {
        // The shell, PATH, the working directory writable by the user, and the entrypoint
        // by name (no /dev in the chroot: its output goes to a file).
        let name = first.rsplit('/').next().unwrap_or(first);
        let script = format!(
            "cd {workdir} && {name} --help >.xtask-write && grep -q Usage: .xtask-write \
             && rm .xtask-write && echo shell-ok"
        );
        let out = run_inside(&["/bin/sh", "-c", &script])?;
        if out.trim() != "shell-ok" {
            bail!("/bin/sh -c {script:?}: {out}");
        }
        println!("  /bin/sh: runs, finds {name} on PATH, {workdir} writable");
    }
    Ok(())
}
