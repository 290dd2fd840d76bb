//! Debian's `snmpd` for the SNMP power driver's tests (`jumpstarter-drivers`' `power::`
//! tests start it on a loopback port with a config of their own): `prepare` installs the
//! package with `apt-get` when it is missing.

use std::process::Command;

use anyhow::Result;

/// The Debian package the tests need.
const PACKAGE: &str = "snmpd";

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Installs `snmpd` unless it is there.
pub fn prepare() -> Result<()> {
    if installed() {
        return Ok(());
    }
    crate::workspace::apt_install(&[PACKAGE], false, "the SNMP power tests need it")?;
    // The package enables and starts a system agent on port 161; the tests run their own.
    let _ = Command::new("sh")
        .args([
            "-c",
            "command -v systemctl >/dev/null && systemctl disable --now snmpd",
        ])
        .status();
    Ok(())
}
