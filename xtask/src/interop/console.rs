//! Interop of serial consoles and networks: upstream's Python client on our exporter, and
//! our `j` on upstream's exporter, with a pseudo-terminal board (`interop/board.py`).

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};

use super::{CALL_TIMEOUT, Env, check, distributed, path_with_venv};
use crate::procs::{self, Background};

const START: Duration = Duration::from_secs(60);

/// A running board: its device link and echo server port.
struct Board {
    _proc: Background,
    link: PathBuf,
    echo_port: u16,
}

fn start_board(env: &Env, name: &str) -> Result<Board> {
    let link = env.work.path().join(format!("{name}-tty"));
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("board.py")).arg(&link);
    let mut proc = Background::start("board.py", c)?;
    let line = proc.wait_for_line("echo port ", START)?;
    let echo_port = line
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("board.py printed {line:?}"))?;
    proc.wait_for_line("board ready", START)?;
    Ok(Board {
        _proc: proc,
        link,
        echo_port,
    })
}

/// An exporter config with the board's console as `serial` and its echo server as `net`.
fn console_config(env: &Env, board: &Board, name: &str) -> Result<PathBuf> {
    let path = env.work.path().join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: {name}
endpoint: \"\"
token: \"\"
{}",
            console_export(board)
        ),
    )?;
    Ok(path)
}

/// The `export:` mapping of [`console_config`].
fn console_export(board: &Board) -> String {
    format!(
        "export:
  serial:
    type: jumpstarter_driver_pyserial.driver.PySerial
    config:
      url: {}
      baudrate: 115200
  net:
    type: jumpstarter_driver_network.driver.TcpNetwork
    config:
      host: 127.0.0.1
      port: {}
",
        board.link.display(),
        board.echo_port
    )
}

/// Upstream `PySerialClient.pexpect()` and `TcpPortforwardAdapter` in our `jmp shell`.
pub fn py_client_to_our_exporter(env: &Env) -> Result<()> {
    let board = start_board(env, "py-client")?;
    let config = console_config(env, &board, "console-ours")?;
    let mut c = env.ours(&env.jmp);
    c.env("PATH", path_with_venv(env))
        .arg("shell")
        .arg("--exporter-config")
        .arg(&config)
        .arg("--")
        .arg(env.venv.join("bin/python"))
        .arg(env.scripts.join("console_client.py"));
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, "python console_client.py in our jmp shell")?;
    ensure!(
        out.stdout.contains("python console ok")
            && out
                .stdout
                .contains(&format!("address: tcp://127.0.0.1:{}", board.echo_port)),
        "{}",
        out.stdout
    );
    Ok(())
}

/// Our `j` (address, forward-tcp, serial pipe) against upstream's exporter.
pub fn our_j_to_py_exporter(env: &Env) -> Result<()> {
    let board = start_board(env, "rs-client")?;
    let config = console_config(env, &board, "console-py")?;
    let sock = env.work.path().join("py-console.sock");
    let _ = std::fs::remove_file(&sock);
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("serve_unix.py"))
        .arg(&config)
        .arg(&sock);
    let _exporter = Background::start("(python) serve_unix.py", c)?;
    procs::wait_path(&sock, START)?;
    let host = sock.to_string_lossy().to_string();

    let j = |args: &[&str]| -> Result<procs::Output> {
        let mut c = env.ours(&env.j);
        c.env("JUMPSTARTER_HOST", &host).args(args);
        procs::run(c, CALL_TIMEOUT)
    };
    let out = j(&["net", "address"])?;
    check(&out, "our j net address")?;
    ensure!(
        out.stdout.trim() == format!("127.0.0.1:{}", board.echo_port),
        "j net address printed {:?}",
        out.stdout
    );
    let out = j(&["net", "address", "--port"])?;
    check(&out, "our j net address --port")?;
    ensure!(
        out.stdout.trim() == board.echo_port.to_string(),
        "{}",
        out.stdout
    );

    // forward-tcp prints its address on stdout: sent to stderr here to be read line by line.
    let mut sh = Command::new("sh");
    sh.env("JMP_CLIENT_CONFIG_HOME", env.work.path().join("rs-config"))
        .env("JUMPSTARTER_HOST", &host)
        .arg("-c")
        .arg(r#"exec "$0" net forward-tcp 0 1>&2"#)
        .arg(&env.j);
    let mut fwd = Background::start("our j net forward-tcp", sh)?;
    let addr = fwd.wait_for_line("127.0.0.1:", START)?;
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr.trim())
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(CALL_TIMEOUT))?;
        s.write_all(b"forwarded by our j")?;
        let mut got = [0u8; 18];
        s.read_exact(&mut got)?;
        ensure!(&got == b"forwarded by our j", "{got:?}");
    }
    fwd.stop();

    // pipe: stdin to the console, its output (sent to stderr here) back.
    let mut sh = Command::new("sh");
    sh.env("JMP_CLIENT_CONFIG_HOME", env.work.path().join("rs-config"))
        .env("JUMPSTARTER_HOST", &host)
        .arg("-c")
        .arg(r#"printf '\nroot\necho pipe-ok\n' | exec "$0" serial pipe 1>&2"#)
        .arg(&env.j);
    let mut pipe = Background::start("our j serial pipe", sh)?;
    pipe.wait_for_line("Welcome to the board", START)?;
    pipe.wait_for_line("pipe-ok", START)?;
    pipe.stop();
    Ok(())
}

/// Upstream `PySerialClient.pexpect()` and `TcpPortforwardAdapter` in upstream's
/// `jmp shell`, leasing our exporter through our controller and router.
pub fn py_client_to_our_exporter_routed(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "dist-console-rs-exporter-data")?.0;
    let board = start_board(env, "dist-py-client")?;
    let exporter = distributed::exporter_config_with(
        env,
        "rs-console-exporter",
        "rs-console",
        &console_export(&board),
    )?;
    let client = distributed::client_config(env, "py-console-client")?;
    let mut c = env.ours(&env.jmp);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut our_exporter = Background::start("jmp run", c)?;
    our_exporter.wait_for_line("registered with controller", START)?;

    let python = env.venv.join("bin/python");
    let script = env.scripts.join("console_client.py");
    let out = distributed::py_shell(env, &client, "rs-console", &[&python, &script])?;
    check(
        &out,
        "(python) jmp shell -l board=rs-console -- python console_client.py",
    )?;
    ensure!(
        out.stdout.contains("python console ok")
            && out
                .stdout
                .contains(&format!("address: tcp://127.0.0.1:{}", board.echo_port)),
        "{}",
        out.stdout
    );
    Ok(())
}

/// Our `jmp shell` and `j` (address, forward-tcp, serial pipe) leasing upstream's exporter
/// through our controller and router.
pub fn our_j_to_py_exporter_routed(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "dist-console-py-exporter-data")?.0;
    let board = start_board(env, "dist-rs-client")?;
    let exporter = distributed::exporter_config_with(
        env,
        "py-console-exporter",
        "py-console",
        &console_export(&board),
    )?;
    let client = distributed::client_config(env, "rs-console-client")?;
    let mut c = env.upstream("jmp");
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut py_exporter = Background::start("(python) jmp run", c)?;
    py_exporter.wait_for_line("Currently not leased", START)?;

    // forward-tcp and pipe run in the background of the shell's script; each is waited for
    // (at most 30 s) by polling its output file, then stopped.
    let w = env.work.path().join("dist-console");
    std::fs::create_dir_all(&w)?;
    let script = format!(
        r#"set -e
W={w}
wait_for() {{ i=0; until grep -q "$1" "$2"; do i=$((i+1)); if [ $i -gt 300 ]; then echo "no $1 in $2:"; cat "$2"; return 1; fi; sleep 0.1; done; }}
echo "address $(j net address)"
j net forward-tcp 0 > "$W/fwd.out" 2>&1 &
F=$!
wait_for '^127.0.0.1:' "$W/fwd.out"
{python} {check} "$(grep '^127.0.0.1:' "$W/fwd.out" | head -n 1)" 'routed by our j'
kill $F
printf '
root
echo pipe-ok
' | j serial pipe > "$W/pipe.out" 2>&1 &
P=$!
wait_for 'pipe-ok' "$W/pipe.out"
grep -q 'Welcome to the board' "$W/pipe.out"
kill $P
echo "routed console ok"
"#,
        w = quoted(&w),
        python = quoted(&env.venv.join("bin/python")),
        check = quoted(&env.scripts.join("forward_check.py")),
    );
    let out = distributed::our_shell(env, &client, "py-console", &script)?;
    check(&out, "jmp shell -l board=py-console -- j net/serial ...")?;
    distributed::no_tunnel_lost(&out)?;
    ensure!(
        out.stdout
            .contains(&format!("address 127.0.0.1:{}", board.echo_port))
            && out.stdout.contains("forward ok")
            && out.stdout.contains("routed console ok"),
        "{}",
        out.stdout
    );
    Ok(())
}

/// Upstream's 0.9.0 client, unaware of observers and of sharing, owns a lease on our
/// exporter (our controller and router) and uses the console (`PySerialClient.pexpect()`,
/// the `connect` stream); the owner's lease is shared (`jmp share add`, ours) with our
/// client, whose `j serial pipe --observe` in our `jmp shell --lease` watches meanwhile and
/// receives the same bytes.
pub fn py_owner_with_our_observer_routed(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "dist-console-observed-data")?.0;
    let board = start_board(env, "observed")?;
    let exporter = distributed::exporter_config_with(
        env,
        "rs-observed-exporter",
        "rs-observed",
        &console_export(&board),
    )?;
    let owner = distributed::client_config(env, "py-owner")?;
    let watcher = distributed::client_config(env, "rs-watcher")?;
    let mut c = env.ours(&env.jmp);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut our_exporter = Background::start("jmp run", c)?;
    our_exporter.wait_for_line("registered with controller", START)?;

    let lease = super::controller::py_create_lease(env, &owner, "board=rs-observed")?;
    let mut c = env.ours(&env.jmp);
    c.args(["share", "add", &lease, "rs-watcher", "--client-config"])
        .arg(&owner);
    check(
        &procs::run(c, CALL_TIMEOUT)?,
        "jmp share add LEASE rs-watcher (the owner's config)",
    )?;

    // Our observer on the shared lease, its console output to a file.
    let seen = env.work.path().join("observer.out");
    let path = format!(
        "{}:{}",
        env.jmp.parent().context("no binary directory")?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = env.ours(std::path::Path::new("sh"));
    c.env("PATH", &path)
        .args(["-c", r#"out="$1"; shift; exec "$@" > "$out""#, "sh"])
        .arg(&seen)
        .arg(&env.jmp)
        .args(["shell", "--lease", &lease, "--client-config"])
        .arg(&watcher)
        .args(["--", "j", "serial", "pipe", "--observe"]);
    let mut observer =
        Background::start("jmp shell --lease (shared) -- j serial pipe --observe", c)?;
    // Attached once the console counts it (polled through the shared lease too).
    let mut status = String::new();
    for _ in 0..30 {
        let mut c = env.ours(&env.jmp);
        c.env("PATH", &path)
            .args(["shell", "--lease", &lease, "--client-config"])
            .arg(&watcher)
            .args(["--", "j", "serial", "console-status"]);
        let out = procs::run(c, CALL_TIMEOUT)?;
        check(
            &out,
            "jmp shell --lease (shared) -- j serial console-status",
        )?;
        status = out.stdout;
        if status.contains("Observers: 1") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        status.contains("Observers: 1"),
        "the observer never attached: {status}"
    );

    // The owner, with upstream's tools, logs into the board through `connect`.
    let mut c = env.upstream("jmp");
    c.env("PATH", path_with_venv(env))
        .args(["shell", "--lease", &lease, "--client-config"])
        .arg(&owner)
        .arg("--")
        .arg(env.venv.join("bin/python"))
        .arg(env.scripts.join("console_client.py"));
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(
        &out,
        "(python) jmp shell --lease LEASE -- python console_client.py",
    )?;
    ensure!(out.stdout.contains("python console ok"), "{}", out.stdout);

    // The observer got the same bytes: the login, the shell and the command's output.
    let mut text = String::new();
    for _ in 0..300 {
        text = std::fs::read_to_string(&seen).unwrap_or_default();
        if text.contains("Welcome to the board") && text.contains("interop-ok") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        text.contains("board login: ")
            && text.contains("Welcome to the board")
            && text.contains("root@board:~# ")
            && text.contains("interop-ok"),
        "the observer did not see the owner's session: {text:?}"
    );
    observer.stop();
    let out = super::controller::py_jmp(env, &owner, &["delete", "leases"], &[&lease])?;
    check(&out, "(python) jmp delete leases")?;
    Ok(())
}

fn quoted(p: &std::path::Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}
