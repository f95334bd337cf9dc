//! Which line a frame waits in at a connection (issue "Streams": control traffic is never
//! queued behind bulk data). The driver keeps two lines per connection: frames of the control
//! line go to the socket first; bulk frames are handed to it only while little else waits
//! there (`limits::BULK_FEED_BYTES`), so a heartbeat, a fault notice, a RELM acknowledgement
//! or a message overtakes a stream's chunks instead of waiting behind up to a window of them.
//!
//! Order is kept where a protocol needs it:
//! - everything a producer sends on a stream (`Data`, `End`, `Fail`) is bulk: its chunks and
//!   its end stay in order;
//! - what a consumer sends (`Open`, `Credit`, `Cancel`) is control: credit is not held up by
//!   bulk data going the other way;
//! - a direct link's messages are markers: one that finds bulk frames waiting queues behind
//!   them, because a `Switch` or `Ready` says "everything before me went this way" (and a
//!   stream's chunks are among that).
//!
//! A lost connection gives back the control line's unsent frames, then the bulk line's.

use crate::oob::{Header, Kind};

/// The line a frame waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Written before any bulk frame not yet handed to the socket.
    Control,
    /// Stream data: written when no control frame waits.
    Bulk,
    /// Keeps its place behind the bulk frames already waiting (control otherwise).
    Marker,
}

/// The lane of a frame with `header`, whose payload starts with `head`.
pub fn lane(header: &Header, head: &[u8]) -> Lane {
    if header.kind != Kind::Msg {
        return Lane::Control;
    }
    match header.tag {
        super::TAG_STREAM
            if head
                .first()
                .is_some_and(|&k| crate::stream::wire::from_producer(k)) =>
        {
            Lane::Bulk
        }
        crate::direct::TAG_DIRECT => Lane::Marker,
        _ => Lane::Control,
    }
}

/// Whether a frame with `header` is a message whose latency a long write of stream data would
/// hurt (the driver writes stream data in short pieces for a while after one:
/// `limits::BULK_QUIET_AFTER_MS`). Heartbeats, link acknowledgements, the negotiation of
/// direct links and the streams' own frames (data, credit, open, end) are not: they come with
/// streams, and waiting a write's time costs them nothing.
#[inline]
pub fn keeps_bulk_writes_small(header: &Header) -> bool {
    match header.kind {
        Kind::Msg => header.tag != super::TAG_STREAM && header.tag != crate::direct::TAG_DIRECT,
        Kind::RelmData | Kind::Relm | Kind::Grpcomm | Kind::Xcast => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::wire::StreamMsg;
    use bytes::Bytes;

    fn header(kind: Kind, tag: u32) -> Header {
        Header {
            kind,
            origin: 1,
            dst: 2,
            tag,
            epoch: 0,
            seq: 0,
            len: 0,
            lives: 0,
        }
    }

    #[test]
    fn a_producers_messages_are_bulk_a_consumers_control() {
        let h = header(Kind::Msg, super::super::TAG_STREAM);
        let data = StreamMsg::Data {
            offset: 0,
            digest: 0,
            bytes: Bytes::from_static(b"x"),
        };
        let end = StreamMsg::End {
            total: 1,
            digests: 0,
        };
        let fail = StreamMsg::Fail {
            code: 1,
            reason: "r".into(),
        };
        for m in [data, end, fail] {
            assert_eq!(lane(&h, &m.encode(7)), Lane::Bulk, "{m:?}");
        }
        let open = StreamMsg::Open {
            offset: 0,
            window: 1,
            route: None,
            service: "s".into(),
            request: Bytes::new(),
        };
        for m in [open, StreamMsg::Credit { upto: 9 }, StreamMsg::Cancel] {
            assert_eq!(lane(&h, &m.encode(7)), Lane::Control, "{m:?}");
        }
        // No payload: control (the receiver refuses it as malformed anyway).
        assert_eq!(lane(&h, &[]), Lane::Control);
    }

    #[test]
    fn direct_link_messages_are_markers_and_the_rest_control() {
        assert_eq!(
            lane(&header(Kind::Msg, crate::direct::TAG_DIRECT), &[1]),
            Lane::Marker
        );
        for kind in Kind::ALL {
            if kind != Kind::Msg {
                assert_eq!(
                    lane(&header(kind, super::super::TAG_STREAM), &[2]),
                    Lane::Control
                );
            }
        }
        assert_eq!(lane(&header(Kind::Msg, 100), &[2]), Lane::Control);
    }

    #[test]
    fn messages_keep_bulk_writes_small_and_the_streams_own_frames_do_not() {
        for kind in [Kind::RelmData, Kind::Relm, Kind::Grpcomm, Kind::Xcast] {
            assert!(keeps_bulk_writes_small(&header(kind, 0)), "{kind:?}");
        }
        assert!(keeps_bulk_writes_small(&header(Kind::Msg, 100)));
        assert!(!keeps_bulk_writes_small(&header(
            Kind::Msg,
            super::super::TAG_STREAM
        )));
        assert!(!keeps_bulk_writes_small(&header(
            Kind::Msg,
            crate::direct::TAG_DIRECT
        )));
        for kind in [
            Kind::Heartbeat,
            Kind::Link,
            Kind::Hello,
            Kind::Auth,
            Kind::Ready,
        ] {
            assert!(!keeps_bulk_writes_small(&header(kind, 100)), "{kind:?}");
        }
    }
}
