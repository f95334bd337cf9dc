//! Subcommands of the `tbon` binary; each module parses its arguments and renders its output.
pub mod bench;
pub mod clock;
pub mod daemon;
pub mod harness;
pub mod report;
pub mod sim;
pub mod status;
pub mod stream_workload;
pub mod sweep;
pub mod tree;
pub mod workload;
