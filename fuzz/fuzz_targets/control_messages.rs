//! Every runtime control-message decoder on arbitrary bytes: fault reports, confirmations,
//! adoption notices, the wire-up contact slice and report, contact lookups and their replies,
//! RELM control messages, batch frames (plain and reliable), the collectives' messages (xcast, allgather, allgather results),
//! direct-link and stream messages, clients' messages between daemons and on their local
//! socket, and contact URIs. Errors are fine; panics are not. A collective or stream message
//! that decodes is encoded again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tbon::node::lookup::{LookupReply, decode_request};
use tbon::node::wireup::{Slice, decode_report};
use tbon::faults::notice::{Adoption, Confirmation, decode_ranks};
use tbon::grpcomm::{AllgatherMsg, AllgatherResult, GroupMsg, XcastMsg};
use tbon::oob::uri::ContactUri;
use tbon::direct::DirectMsg;
use tbon::relm::Control;
use tbon::relm::batch::{Items as RelmItems, Packed, Packer as RelmPacker};
use tbon::stream::StreamMsg;
use tbon::clients::local::{LocalDecoder, ToClient, ToDaemon};
use tbon::clients::wire::{Control as ClientControl, DataHeader};

fuzz_target!(|data: &[u8]| {
    let Some((&size, rest)) = data.split_first() else {
        return;
    };
    let size = u32::from(size).max(1);
    let _ = decode_ranks(size, rest);
    let _ = Confirmation::decode(size, rest);
    let _ = Adoption::decode(size, rest);
    let _ = Slice::decode(size, rest);
    let _ = decode_request(size, rest);
    let _ = LookupReply::decode(size, rest);
    let _ = decode_report(size - 1, rest);
    let _ = Control::decode(size, rest);
    if let Ok(m) = XcastMsg::decode(size, rest.to_vec().into()) {
        let _ = m.encode_parts();
    }
    if let Ok(m) = AllgatherMsg::decode(size, rest.to_vec().into()) {
        let _ = m.encode();
    }
    if let Ok(r) = AllgatherResult::decode(size, rest.to_vec().into()) {
        let _ = r.encode();
    }
    // A group message that decodes encodes back to the same bytes (one encoding per set).
    if let Ok(m) = GroupMsg::decode(size, rest.to_vec().into()) {
        assert_eq!(&m.encode()[..], rest);
    }
    // Batch frames, plain and reliable: a reliable batch that decodes packs back to the
    // same bytes.
    if let Ok(items) = tbon::rml::batch_frame::Items::new(rest.to_vec().into()) {
        let _ = items.count();
    }
    if let Ok(items) = RelmItems::new(rest.to_vec().into(), 0, 1, |t| t >= 100) {
        let mut p = RelmPacker::with_frame_max(usize::MAX);
        let mut packed = Vec::new();
        for d in items {
            if RelmPacker::packable(&d) {
                packed.extend(p.push(2, d));
            } else {
                packed.extend(p.finish());
            }
        }
        packed.extend(p.finish());
        if let [Packed::Batch { payload, .. }] = packed.as_slice() {
            assert_eq!(&payload[..], rest);
        }
    }
    let _ = DirectMsg::decode(rest);
    if let Ok((id, m)) = StreamMsg::decode(&rest.to_vec().into()) {
        let _ = m.encode(id);
    }
    // Clients: between daemons, and the local socket's frames (a decoded frame encodes back).
    let _ = ClientControl::decode(rest);
    let _ = DataHeader::decode(rest.to_vec().into());
    if let Ok(m) = ToDaemon::decode(rest.to_vec().into()) {
        assert_eq!(&m.encode()[4..], rest);
    }
    if let Ok(m) = ToClient::decode(rest.to_vec().into()) {
        let _ = m.encode();
    }
    let mut d = LocalDecoder::new(size as usize * 16);
    let mut r = rest;
    if d.read_from(&mut r).is_ok() {
        while let Ok(Some(body)) = d.next_body() {
            let _ = ToDaemon::decode(body);
        }
    }
    if let Ok(s) = std::str::from_utf8(rest) {
        let _ = s.parse::<ContactUri>();
    }
});
