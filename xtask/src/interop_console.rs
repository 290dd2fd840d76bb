//! Interop of serial consoles and networks: upstream's Python client on our exporter, and
//! our `j` on upstream's exporter, with a pseudo-terminal board (`interop/board.py`).

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};

use super::{CALL_TIMEOUT, Env, check, path_with_venv};
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
export:
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
        ),
    )?;
    Ok(path)
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
