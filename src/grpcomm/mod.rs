//! Tree collectives, sans-IO: fault-tolerant broadcast (xcast) and allgather.
//!
//! - [`wire`]: the byte layouts of every message, with decoders that return errors on any input.
pub mod wire;

pub use wire::{AllgatherMsg, AllgatherResult, Contribution, Op, Request, WireError, XcastMsg};
