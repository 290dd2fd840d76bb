//! The `jmp` and `j` command-line tools, as a library: the binaries only call
//! [`jmp_main`] and [`j_main`]; a lab's own binaries call [`jmp_main_with`] and
//! [`j_main_with`] with a [`Toolkit`] (the stock drivers and `j` commands plus its own);
//! [`Cli`] is `jmp`'s argument parser (for tests and for tools
//! that generate completions or docs). Everything else (the exporter runtime, `jmp shell`,
//! `jmp admin`, the MCP server) is private to the binaries.

// The doc comments of clap arguments are the commands' `--help` text, written as upstream
// prints it (`[default]`, `[client-name@]host`), not as links.
#![allow(rustdoc::broken_intra_doc_links)]

mod admin;
mod admin_api;
mod admin_pools;
mod auth;
mod completion;
mod config_cmd;
mod direct_certs;
mod distributed;
mod hints;
mod hook_wait;
mod j;
mod jmp;
mod lease_end;
mod lease_logs;
mod logging;
mod login;
mod mcp;
mod output;
mod pipe;
mod resources;
mod share;
mod shell;
mod signals;
mod toolkit;
mod values;

pub use j::{main as j_main, main_with as j_main_with};
pub use jmp::{Cli, main as jmp_main, main_with as jmp_main_with};
pub use toolkit::Toolkit;
