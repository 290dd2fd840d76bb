//! A client's environment variables reach the Shell driver's script as data and nothing more:
//! names that change how the shell or the dynamic loader behave are refused before anything
//! runs. Each attack is first shown to work when the same command line runs without the
//! driver's check (so the test proves the refusal is what stops it).

use std::{
    collections::BTreeMap,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

use futures::StreamExt;
use jumpstarter_core::{ClientError, Driver, driver::DriverArgs};
use jumpstarter_drivers::{Shell, ShellClient};
use serde_json::json;

use crate::Served;

/// The script of every method here: it leaves `ran` in its working directory.
const SCRIPT: &str = "touch ran";

/// The interpreter the driver runs. Bash ignores `PS4` from the environment when it runs as
/// root, so under root the script runs as `nobody` (through `setpriv`), where the `PS4`
/// attack works as it would on an exporter that is not root.
fn interpreter() -> Vec<String> {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let setpriv = Path::new("/usr/bin/setpriv");
    let mut argv = Vec::new();
    if root && setpriv.exists() {
        argv.extend(
            [
                "/usr/bin/setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]
            .map(String::from),
        );
    }
    argv.extend(["bash", "-c"].map(String::from));
    argv
}

/// A working directory every user may write (the script may run as `nobody`).
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn served(dir: &Path) -> Served {
    let config = json!({
        "methods": {"m": SCRIPT, "show": "printf '%s|%s|%s' \"$FOO\" \"$BOARD_IP\" \"$LC_ALL\""},
        "shell": interpreter(),
        "cwd": dir,
    });
    let driver: Arc<dyn Driver> = Shell::from_args(&DriverArgs { config }).unwrap();
    Served::start(vec![("sh", driver)])
}

async fn client(served: &Served) -> ShellClient {
    ShellClient(served.client().await.driver("sh").unwrap())
}

fn env_of(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Runs `method` through the driver to its end: stdout and the exit code.
async fn call(
    c: &ShellClient,
    method: &str,
    env: &BTreeMap<String, String>,
) -> Result<(String, i64), ClientError> {
    let mut s = c.call_method(method, env, &[]).await?;
    let (mut out, mut code) = (String::new(), None);
    while let Some(item) = s.next().await {
        let item = item?;
        out.push_str(&item.stdout);
        code = item.returncode.or(code);
    }
    Ok((out, code.expect("no exit code")))
}

/// Runs the driver's own command line for method `m` directly, with `env` added: what the
/// driver would run if it passed `env` on.
fn run_unchecked(dir: &Path, env: &BTreeMap<String, String>) {
    let argv = interpreter();
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .args([SCRIPT, "m"])
        .envs(env)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
}

fn clear(dir: &Path, files: &[&PathBuf]) {
    for f in files {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_file(dir.join("ran"));
}

/// One attack: the variables a client sends, and whether running them unchecked is shown
/// to run the attacker's command (a `LD_PRELOAD` would need a library built for it).
struct Attack {
    what: &'static str,
    env: Vec<(&'static str, String)>,
    refused: &'static str,
    shown_unchecked: bool,
}

#[tokio::test]
async fn variables_that_change_the_shell_or_the_loader_are_refused_before_anything_runs() {
    let dir = open_dir();
    let d = dir.path();
    let marker = d.join("MARKER");
    // BASH_ENV: a file bash sources before a non-interactive script.
    let rc = d.join("rc");
    write_exec(&rc, &format!("touch '{}'\n", marker.display()));
    // PATH: a directory whose `touch` is the attacker's.
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    write_exec(
        &bin.join("touch"),
        &format!("#!/bin/sh\n/usr/bin/touch '{}'\n", marker.display()),
    );
    let attacks = [
        Attack {
            what: "xtrace with a command substitution in PS4",
            env: vec![
                ("SHELLOPTS", "xtrace".into()),
                ("PS4", format!("$(touch '{}')", marker.display())),
            ],
            refused: "Environment variable 'PS4' is blocked for security reasons: it changes \
                      how the shell runs the script",
            shown_unchecked: true,
        },
        Attack {
            what: "SHELLOPTS alone",
            env: vec![("SHELLOPTS", "xtrace".into())],
            refused: "Environment variable 'SHELLOPTS' is blocked for security reasons",
            shown_unchecked: false,
        },
        Attack {
            what: "BASH_ENV",
            env: vec![("BASH_ENV", rc.display().to_string())],
            refused: "Environment variable 'BASH_ENV' is blocked for security reasons",
            shown_unchecked: true,
        },
        Attack {
            what: "PATH",
            env: vec![("PATH", format!("{}:/usr/bin:/bin", bin.display()))],
            refused: "Environment variable 'PATH' is blocked for security reasons",
            shown_unchecked: true,
        },
        Attack {
            what: "an exported function named as the script's command",
            env: vec![(
                "BASH_FUNC_touch%%",
                format!("() {{ /usr/bin/touch '{}'; }}", marker.display()),
            )],
            refused: "Invalid environment variable name: BASH_FUNC_touch%%",
            shown_unchecked: true,
        },
        Attack {
            what: "LD_PRELOAD",
            env: vec![("LD_PRELOAD", d.join("evil.so").display().to_string())],
            refused: "Environment variable 'LD_PRELOAD' is blocked for security reasons: it \
                      changes how the dynamic loader or the C library loads code and data",
            shown_unchecked: false,
        },
        Attack {
            what: "an allowed name beside a refused one",
            env: vec![
                ("FOO", "bar".into()),
                ("LD_LIBRARY_PATH", d.display().to_string()),
            ],
            refused: "Environment variable 'LD_LIBRARY_PATH' is blocked for security reasons",
            shown_unchecked: false,
        },
    ];
    let served = served(d);
    let c = client(&served).await;
    for a in &attacks {
        let env = env_of(&a.env);
        if a.shown_unchecked {
            run_unchecked(d, &env);
            assert!(
                marker.exists(),
                "{}: the attack does not work even unchecked, so this test shows nothing",
                a.what
            );
            clear(d, &[&marker]);
        }
        let e = call(&c, "m", &env).await.unwrap_err();
        assert!(e.to_string().contains(a.refused), "{}: {e}", a.what);
        assert!(!marker.exists(), "{}: the attacker's command ran", a.what);
        assert!(!d.join("ran").exists(), "{}: the method ran", a.what);
    }
    // Refused calls change nothing; the driver still runs the script.
    let (_, code) = call(&c, "m", &BTreeMap::new()).await.unwrap();
    assert_eq!(code, 0);
    assert!(d.join("ran").exists());
    assert!(!marker.exists());
}

#[tokio::test]
async fn allowed_variables_reach_the_script_as_plain_text() {
    let dir = open_dir();
    let d = dir.path();
    let marker = d.join("MARKER");
    let served = served(d);
    let c = client(&served).await;
    let (out, code) = call(
        &c,
        "show",
        &env_of(&[
            ("FOO", "bar".into()),
            ("BOARD_IP", "10.0.0.7".into()),
            ("LC_ALL", "C".into()),
        ]),
    )
    .await
    .unwrap();
    assert_eq!((out.as_str(), code), ("bar|10.0.0.7|C", 0));
    // A value is text: the shell does not run what it says.
    let nasty = format!(
        "$(touch '{}'); `touch '{}'`",
        marker.display(),
        marker.display()
    );
    let (out, code) = call(&c, "show", &env_of(&[("FOO", nasty.clone())]))
        .await
        .unwrap();
    assert_eq!((out, code), (format!("{nasty}||"), 0));
    assert!(!marker.exists(), "a value ran as a command");
}

#[tokio::test]
async fn j_reports_the_refused_variable() {
    let dir = open_dir();
    let served = served(dir.path());
    let session = served.client().await;
    let matches = jumpstarter_drivers::j_command(&session)
        .await
        .try_get_matches_from(["j", "sh", "m", "-e", "SHELLOPTS=xtrace", "-e", "PS4=$(id)"])
        .unwrap();
    let e = jumpstarter_drivers::run_j_command(session.root(), matches)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("Environment variable 'PS4' is blocked for security reasons"),
        "{e}"
    );
    assert!(!dir.path().join("ran").exists());
}
