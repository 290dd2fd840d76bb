//! Interop of the SNMP PDU driver, with Debian's `snmpd` simulating outlets (a `pass`
//! script, `interop/snmp_outlet.sh`): upstream's `j` (`SNMPServerClient`) on our
//! `SNMPServer`, and our `j` on upstream's `SNMPServer` (pysnmp), at authPriv (SHA, AES).

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Result, ensure};

use super::{CALL_TIMEOUT, Env, check, our_j};
use crate::procs::{self, Background};

/// A running `snmpd` and where its outlets' states are kept.
struct Agent {
    _proc: Background,
    port: u16,
    state: PathBuf,
}

fn start_snmpd(env: &Env, name: &str) -> Result<Agent> {
    crate::snmpd::prepare()?;
    let dir = env.work.path().join(name);
    std::fs::create_dir_all(dir.join("persist"))?;
    std::fs::create_dir_all(dir.join("mibs"))?;
    let script = dir.join("outlet.sh");
    std::fs::copy(env.scripts.join("snmp_outlet.sh"), &script)?;
    let port = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        s.local_addr()?.port()
    };
    let conf = dir.join("snmpd.conf");
    std::fs::write(
        &conf,
        format!(
            "agentaddress udp:127.0.0.1:{port}
createUser labuser SHA \"authpass1\" AES \"privpass1\"
rwuser labuser priv
pass .1.3.6.1.4.1.13742.6.4.1.2.1.2.1 /bin/sh {}
",
            script.display()
        ),
    )?;
    let snmpd = ["/usr/sbin/snmpd", "/sbin/snmpd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("snmpd"));
    let mut c = Command::new(snmpd);
    c.args(["-f", "-Le", "-C", "-c"])
        .arg(&conf)
        .arg("-M")
        .arg(dir.join("mibs"))
        .args(["-m", "", "-I", "-smux"])
        .env("SNMP_PERSISTENT_DIR", dir.join("persist"));
    let mut proc = Background::start("snmpd", c)?;
    proc.wait_for_line("NET-SNMP version", Duration::from_secs(30))?;
    Ok(Agent {
        _proc: proc,
        port,
        state: dir.join("state"),
    })
}

impl Agent {
    fn outlet(&self, plug: u32) -> Option<String> {
        std::fs::read_to_string(self.state.join(plug.to_string()))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn config(&self, env: &Env, name: &str) -> Result<PathBuf> {
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
  pdu:
    type: jumpstarter_driver_snmp.driver.SNMPServer
    config:
      host: 127.0.0.1
      port: {}
      user: labuser
      plug: 7
      auth_protocol: SHA
      auth_key: authpass1
      priv_protocol: AES
      priv_key: privpass1
      timeout: 10
",
                self.port
            ),
        )?;
        Ok(path)
    }
}

/// Upstream `j pdu on|off|cycle` in our `jmp shell` serving our SNMPServer.
pub fn py_j_to_our_snmp(env: &Env) -> Result<()> {
    let agent = start_snmpd(env, "snmp-ours")?;
    let config = agent.config(env, "snmp-ours")?;
    let script = "J=$0; $J pdu on && cat \"$1/7\" && $J pdu off && cat \"$1/7\" && \
                  $J pdu cycle --wait 1 && cat \"$1/7\"";
    let mut c = env.ours(&env.jmp);
    c.arg("shell")
        .arg("--exporter-config")
        .arg(&config)
        .args(["--", "sh", "-c", script])
        .arg(env.py("j"))
        .arg(&agent.state);
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, "jmp shell -- (python) j pdu on/off/cycle")?;
    let states: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| *l == "0" || *l == "1")
        .collect();
    ensure!(
        states == ["1", "0", "1"],
        "outlet states {states:?}:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// Our `j pdu on|off` against upstream's SNMPServer (pysnmp) on a Unix socket.
pub fn our_j_to_py_snmp(env: &Env) -> Result<()> {
    let agent = start_snmpd(env, "snmp-py")?;
    let config = agent.config(env, "snmp-py")?;
    let sock = env.work.path().join("py-snmp.sock");
    let _ = std::fs::remove_file(&sock);
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("serve_unix.py"))
        .arg(&config)
        .arg(&sock);
    let _exporter = Background::start("(python) serve_unix.py", c)?;
    procs::wait_path(&sock, Duration::from_secs(60))?;
    let host = sock.to_string_lossy().to_string();
    check(&our_j(env, &host, &["pdu", "on"])?, "our j pdu on")?;
    ensure!(agent.outlet(7).as_deref() == Some("1"), "outlet not on");
    check(&our_j(env, &host, &["pdu", "off"])?, "our j pdu off")?;
    ensure!(agent.outlet(7).as_deref() == Some("0"), "outlet not off");
    let out = our_j(env, &host, &["pdu", "--help"])?;
    check(&out, "our j pdu --help")?;
    ensure!(
        out.stdout.contains("cycle"),
        "j pdu --help lacks the power commands:\n{}",
        out.stdout
    );
    Ok(())
}
