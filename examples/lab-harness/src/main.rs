//! `lab-harness`: what a Rust test harness does with a board of the lab, through the
//! `jumpstarter-core` facade only. It leases a board by label from the controller of a client
//! config, flashes an image through the board's storage mux (`storage`), powers it on
//! (`power`), waits for a console prompt on its serial console (`serial`) with the expect
//! API, powers it off and releases the lease (also when a step fails).
//!
//! ```text
//! lab-harness --selector board=rpi4 --image build/sdcard.img [--client-config PATH]
//!             [--prompt 'login:'] [--duration 30m] [--timeout 60s]
//! ```
//!
//! `cargo xtask ci` runs it against a controller and an exporter with mock drivers on
//! loopback (`xtask/src/lab_harness.rs`).

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;
use jumpstarter_core::{
    ClientConfig, ControllerClient, ExporterSession, LeaseRequest, LeaseSession, parse_duration,
};
use jumpstarter_drivers::{PowerClient, PySerialClient, StorageMuxClient, TransferOptions};

/// Lease a board by label, flash it, power it on, wait for its console prompt, release it.
#[derive(Parser, Debug)]
struct Args {
    /// Label selector of the board (`k=v,k2=v2`).
    #[arg(short = 'l', long)]
    selector: String,
    /// The image to flash onto the board's storage.
    #[arg(long)]
    image: PathBuf,
    /// The client config (default: the one `jmp config client use` chose, or `JMP_*`).
    #[arg(long)]
    client_config: Option<PathBuf>,
    /// A regular expression the console prints once the board is up.
    #[arg(long, default_value = "login:")]
    prompt: String,
    /// How long to lease the board.
    #[arg(long, default_value = "30m", value_parser = duration)]
    duration: Duration,
    /// How long to wait for the lease, and for the prompt.
    #[arg(long, default_value = "60s", value_parser = duration)]
    timeout: Duration,
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let cfg = ClientConfig::resolve(args.client_config.as_deref(), None)?;
    let controller = ControllerClient::connect(&cfg).await?;
    let request = LeaseRequest::new(&args.selector, args.duration);
    let lease = LeaseSession::builder(&controller, request)
        .acquisition_timeout(args.timeout)
        .on_wait(|lease, why| eprintln!("waiting for lease {lease}: {why}"))
        .connect()
        .await
        .with_context(|| format!("cannot lease a board with {}", args.selector))?;
    println!(
        "leased {} (lease {})",
        lease.lease().exporter,
        lease.lease().name
    );
    let tested = test_board(lease.session()?, &args).await;
    // Released whatever the test said: the next harness gets the board.
    lease.release().await?;
    println!("released");
    tested
}

/// Flash, power on, wait for the prompt, power off.
async fn test_board(board: &ExporterSession, args: &Args) -> Result<()> {
    let storage = StorageMuxClient(board.driver("storage")?);
    storage
        .flash(&args.image, &TransferOptions::default(), true)
        .await
        .with_context(|| format!("flashing {}", args.image.display()))?;
    println!("flashed {} (verified)", args.image.display());
    let power = PowerClient(board.driver("power")?);
    power.on().await?;
    println!("powered on");
    let mut console = PySerialClient(board.driver("serial")?)
        .console()
        .await?
        .with_timeout(args.timeout);
    let seen = console.expect(&args.prompt).await.with_context(|| {
        format!(
            "no {:?} on the console within {:?}",
            args.prompt, args.timeout
        )
    })?;
    let last_line = seen
        .before_text()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    println!(
        "console: {:?}",
        last_line + &String::from_utf8_lossy(&seen.matched)
    );
    power.off().await?;
    println!("powered off");
    Ok(())
}
