//! The `jmp` and `j` command-line tools, as a library: the binaries only call
//! [`jmp::main`] and [`j::main`].

pub mod j;
pub mod jmp;
mod logging;
pub mod shell;
