//! Both sides of the handshake on arbitrary frames: never a panic, never a proof accepted
//! without the job key (the fuzzer does not know it): no `Authenticated` at the acceptor, no
//! `Auth` sent (nor `Established`) at the dialler.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tbon::oob::handshake::{JobKey, NONCE_LEN};
use tbon::oob::{FrameDecoder, Handshake, HandshakeConfig, HandshakeEvent};

fuzz_target!(|data: &[u8]| {
    let cfg = HandshakeConfig {
        me: 1,
        size: 8,
        epoch: 0,
        dvm_id: "tbon".into(),
        key: JobKey::new(*b"fuzz-target-secret-key"),
    };
    // The nonces come from the input too (the handshake takes them from its caller), so the
    // fuzzer also varies what the MACs cover.
    let (nonces, data) = data.split_at(data.len().min(2 * NONCE_LEN));
    let mut nonce_a = [0u8; NONCE_LEN];
    let mut nonce_d = [0u8; NONCE_LEN];
    let (a, d) = nonces.split_at(nonces.len().min(NONCE_LEN));
    nonce_a[..a.len()].copy_from_slice(a);
    nonce_d[..d.len()].copy_from_slice(d);
    let mut dec = FrameDecoder::new(512);
    dec.feed(data);
    let mut acceptor = Handshake::accept(&cfg, nonce_a);
    let mut dialler = Handshake::dial(&cfg, 2, nonce_d);
    while let Ok(Some(frame)) = dec.next_frame() {
        match acceptor.handle_frame(frame.clone()) {
            Ok(Some(HandshakeEvent::HelloReceived(_))) => {
                acceptor.try_accept_peer();
            }
            Ok(Some(HandshakeEvent::Authenticated(_))) => {
                panic!("an Auth forged without the key was accepted")
            }
            _ => {}
        }
        let established = matches!(
            dialler.handle_frame(frame),
            Ok(Some(HandshakeEvent::Established(_)))
        );
        assert!(
            !established && !dialler.has_sent_proof(),
            "a HelloAck forged without the key was accepted"
        );
        assert!(
            !acceptor.is_established(),
            "an Auth forged without the key was accepted"
        );
        while acceptor.poll_transmit().is_some() {}
        while dialler.poll_transmit().is_some() {}
    }
});
