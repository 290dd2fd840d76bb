//! The `jmp` and `j` command-line tools, as a library: the binaries only call
//! [`jmp::main`] and [`j::main`].

pub mod admin;
pub mod auth;
pub mod config_cmd;
pub mod distributed;
pub mod j;
pub mod jmp;
mod logging;
pub mod login;
pub mod mcp;
pub mod output;
pub mod resources;
pub mod shell;
pub mod values;
