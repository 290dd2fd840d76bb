//! The `jmp` and `j` command-line tools, as a library: the binaries only call
//! [`jmp::main`] and [`j::main`].

// The doc comments of clap arguments are the commands' `--help` text, written as upstream
// prints it (`[default]`, `[client-name@]host`), not as links.
#![allow(rustdoc::broken_intra_doc_links)]

pub mod admin;
pub mod auth;
pub mod completion;
pub mod config_cmd;
pub mod direct_certs;
pub mod distributed;
pub mod exporter;
mod hints;
pub mod j;
pub mod jmp;
pub mod lease_end;
pub mod lifecycle;
mod logging;
pub mod login;
pub mod mcp;
pub mod output;
pub mod pipe;
pub mod resources;
pub mod shell;
mod signals;
pub mod values;
