//! The clients the boot-server tests drive (`jumpstarter-drivers`' `boot::` tests): curl for
//! `HttpServer` and TFTP with options, tftp-hpa's `tftp` for plain RFC 1350 transfers.
//! `ensure` installs the missing ones with `apt-get` (Debian); under `CI=true` those tests
//! fail, naming the tool, when it is missing.

use std::process::Command;

use anyhow::Result;

/// Debian packages and the command each provides.
const TOOLS: [(&str, &str); 2] = [("curl", "curl"), ("tftp-hpa", "tftp")];

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs curl and tftp-hpa when missing.
pub fn ensure() -> Result<()> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(_, cmd)| !have(cmd))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    crate::workspace::apt_install(&missing, false, "the boot-server tests need them")
}
