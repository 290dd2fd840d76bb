//! A lab's own driver, served by the lab's own `jmp` and driven by its own `j`, without
//! forking either: [`Chamber`] (a mock climate chamber: config fields, unary calls, a
//! streaming call and a byte-stream console), its client [`ChamberClient`] with its `j`
//! commands, and [`toolkit`], which the two binaries (`my-jmp`, `my-j`) hand to
//! `jumpstarter_cli`. Upstream's Python client drives it through the client class in
//! `python/jumpstarter_example_chamber/client.py`. See `docs/writing-a-driver.md`.

mod client;
mod driver;

pub use client::{ChamberClient, cli};
pub use driver::{CHAMBER_CLIENT, CHAMBER_TYPE, Chamber, ChamberConfig, ChamberInfo, Reading};

/// The stock drivers and commands plus the chamber's: what `my-jmp` serves and `my-j` offers.
pub fn toolkit() -> jumpstarter_cli::Toolkit {
    jumpstarter_cli::Toolkit::stock()
        .with_driver(CHAMBER_TYPE, Chamber::from_args)
        .with_commands(CHAMBER_CLIENT, cli())
        .with_j_program("my-j")
}
