//! The ZeroMQ baseline of `tbon bench` (cargo feature `zmq`, which links the system's libzmq):
//! a PUSH socket sends `count` messages of `payload` bytes to a PULL socket in another process
//! over TCP on loopback, one `send` call per message, as tbon's per-call rate row does. ZeroMQ
//! batches small messages on its own I/O thread, so this is its best case.

use super::RoleArgs;
use super::util::{RateMeter, Res, ctx, wait_file, write_atomically};
use std::time::Duration;

const GUARD: Duration = Duration::from_secs(120);

/// The PULL side: binds an ephemeral port (written to `<dir>/port.0`), counts `count`
/// messages and prints the same JSON report as the tbon and raw receivers.
pub fn pull(a: &RoleArgs) -> Res<()> {
    let context = zmq::Context::new();
    let s = context.socket(zmq::PULL).map_err(ctx("zmq socket"))?;
    s.set_rcvtimeo(GUARD.as_millis() as i32)
        .map_err(ctx("zmq rcvtimeo"))?;
    s.bind("tcp://127.0.0.1:*").map_err(ctx("zmq bind"))?;
    let endpoint = s
        .get_last_endpoint()
        .map_err(ctx("zmq endpoint"))?
        .map_err(|_| "zmq endpoint is not UTF-8".to_string())?;
    write_atomically(&a.dir.join("port.0"), &endpoint)?;
    let mut meter = RateMeter::new(a.count);
    let mut msg = zmq::Message::new();
    loop {
        s.recv(&mut msg, 0).map_err(ctx("zmq recv"))?;
        if let Some(report) = meter.on_message(msg.len()) {
            println!("{report}");
            return Ok(());
        }
    }
}

/// The PUSH side: connects to the PULL side's endpoint and sends `count` messages.
pub fn push(a: &RoleArgs) -> Res<()> {
    let endpoint = wait_file(&a.dir.join("port.0"), GUARD)?;
    let context = zmq::Context::new();
    let s = context.socket(zmq::PUSH).map_err(ctx("zmq socket"))?;
    // Keep every message until it is sent: the run counts them all.
    s.set_linger(-1).map_err(ctx("zmq linger"))?;
    s.connect(&endpoint).map_err(ctx("zmq connect"))?;
    let payload = vec![7u8; a.payload];
    for _ in 0..a.count {
        s.send(&payload[..], 0).map_err(ctx("zmq send"))?;
    }
    Ok(())
}
