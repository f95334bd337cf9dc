//! The frame decoder on arbitrary bytes, fed in arbitrary chunk sizes (the first byte picks the
//! chunk size): it must never panic and, once it reports an error, keep reporting it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tbon::oob::FrameDecoder;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut dec = FrameDecoder::new(1 << 16);
    for piece in rest.chunks(chunk) {
        dec.feed(piece);
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => assert_eq!(f.payload.len(), f.header.len as usize),
                Ok(None) => break,
                Err(e) => {
                    assert_eq!(dec.next_frame(), Err(e));
                    return;
                }
            }
        }
    }
});
