//! Direct links: a negotiated connection between two daemons beside the tree, so that two
//! daemons that talk a lot stop paying a relay at every tree hop (PVM's "direct message
//! routing"). Sans-IO, like the other protocol cores: [`DirectLinks`] takes requests, answers
//! and time in, and says which route a send takes and which control messages to send over the
//! tree; the node (`node/direct.rs`) carries them out.
//!
//! * `wire.rs` — the control messages (runtime tag [`TAG_DIRECT`]) and their layout.
//! * `table.rs` — [`DirectLinks`]: the link table, the denial cache, the auto policy, counters.
//!
//! # The protocol (version 4)
//! A requester `A` in state `ConnWait` sends `Request` (protocol version, its DVM epoch, the
//! request's number) to `B` over the tree. Meanwhile its messages to `B` keep going over the
//! tree: nothing waits, so the first message after the request is not delayed at all. `B`
//! grants when its `route` setting is not `tree`, the version and epoch match, `A` is not its
//! tree neighbour and it has room under `direct_links_max`; otherwise it denies with a reason.
//! A granting `B` is in `GrantWait`: it sends `Grant` (the link's id and the request's number)
//! over the tree; its own messages to `A` still take the tree. `A`, on the `Grant` for its
//! current request, is `Switched`: it sends `Switch` over the tree, and its messages to `B` go
//! on the direct connection from then on. `B`, on the `Switch`, is `Open`: it sends `Ready`
//! over the tree, and its messages to `A` go on the direct connection from then on. `A`, on
//! the `Ready`, is `Open` too.
//!
//! # Order through the switch
//! `Switch` and `Ready` are drain markers. Each is the last message its sender sends to the
//! other over the tree before it moves to the direct connection, and the tree carries one
//! origin's messages to one destination in order. A daemon does not act on the other's own
//! messages while it waits for the other's marker ([`DirectLinks::may_read`]), so every tree
//! message sent before the switch is delivered before any direct message sent after it.
//! Nothing waits on the sending side. The receiving node keeps those messages, in order and
//! bounded (beyond the bound the connection is not read and TCP holds the sender back), and
//! reads everything else on the connection: a repair may make the other a tree neighbour
//! before this daemon knows it, and its tree messages (the adoption notice first) then come
//! over the same connection (`node/marker_wait.rs`; regression seeds 11549 and 128).
//!
//! Nobody writes on the link before the other end has shown it waits for a marker: the
//! grantor writes only after the requester's `Switch` (which the requester sends only while
//! it waits for that grant), and the requester only after the grant. (Version 3 let the
//! grantor write right after `Grant`; a requester that had given its request up by then read
//! those frames with nothing to wait for, ahead of older tree messages: regression seeds 358
//! and 17532.)
//!
//! # Late and lost markers
//! Time alone cannot tell a slow tree from one that lost a message, so a wait that may still
//! end with data on the link never ends by reading early, and a marker lost with a tree
//! connection is asked for again. A request unanswered within `direct_request_ms` ends denied
//! (`Timeout`) and sends `Withdraw`: no link data exists yet, and a later `Grant` is answered
//! `Withdraw` (the request's number tells an old grant from the answer to a new request). A
//! grant unanswered within `direct_request_ms` stops counting against `direct_links_max`
//! (`Expired`) and is sent again; the requester answers every copy (`Switch` again for the
//! link it switched to, `Withdraw` otherwise). A late `Switch` opens the link, or, with no room
//! left, opens it and at once closes it as an eviction does, so nothing is lost. A requester
//! whose `Ready` is late sends `Switch` again (answered `Ready` again); an end that answered a
//! `Close` and waits for `Shut` sends `AskShut` (answered `Shut` again once the evicting end
//! read `CloseAck`). Copies of markers are harmless: a copy is sent after the first, so it
//! still follows every tree message before the switch, and a second one changes nothing. A
//! `Switch` or `Ready` for a link an end does not wait on is answered `Withdraw`. Only after
//! `limits::DIRECT_MARKER_POKES_MAX` copies (two minutes at the default) does an end give the
//! link up: it sends `Withdraw`, its connection is closed (what it had not read there is lost,
//! as on a lost link), and it reads nothing from that peer's link until the connection is gone
//! or another `direct_request_ms` passed (`Fenced`), so a redial cannot slip old frames in.

//! # Simultaneous requests
//! When each daemon asks the other (both in `ConnWait`), the request of the lower rank wins:
//! the higher rank grants it and drops its own request; the lower rank answers the higher
//! rank's request with the denial `Crossed`, which is neither cached nor counted as a refusal,
//! and which the higher rank (by then in `GrantWait`) ignores. Both then use the one
//! connection the transport keeps between two daemons (`oob::arbiter`); which TCP connection
//! survives a simultaneous dial is the arbiter's rule, the same as for tree links.
//!
//! # Losses and failures
//! A direct link is never a tree edge: it has no heartbeats and its loss is not a daemon
//! failure. When it is lost, both ends fall back to the tree at once: frames not yet written
//! go over the tree in their order (`Output::Fallback`), and later sends take the tree. Plain
//! messages already handed to the kernel on a lost link may be lost, as on a lost tree link.
//! A request to a daemon that dies (or is already known dead) ends `Denied` through the fault
//! handling, never by waiting; a request nobody answers ends `Denied` (`Timeout`) after
//! `direct_request_ms` (see "Late markers"). A link whose connection cannot be made within
//! the driver's reconnect attempts ends the same way as a lost one (never a failure of the
//! peer: the tree decides that); that end caches the local denial `Unreachable` and sends
//! `Withdraw`, which ends the other end's link too. An end that ends a link it wrote or read on
//! closes the connection (`Output::Fallback`): the other end sees it lost and falls back too.
//!
//! # Reliable messages
//! RELM needs no marker: its per-(origin, destination) chains post in order and drop copies
//! whichever way each message came. An origin sends its own reliable messages on an open link
//! (`relm::Topology::direct`), a destination takes data from the origin itself, and the origin
//! takes acknowledgements and requests from the destination itself. When the link is lost,
//! every unacknowledged reliable message to the peer goes again over the tree at once, and the
//! peer's chain is acknowledged again over the tree (`Relm::handle_direct_lost`).
//!
//! # Eviction
//! At `direct_links_max`, a new link (asked for or granted) evicts the least recently used
//! link that carried nothing from this end for `direct_auto_window_ms`; with none idle there is
//! no room. Closing needs no new order rule on the tree, only this: each end switches a message
//! to the tree only once the other has read everything it wrote on the link.
//! The evicting end `E` writes `Close` as its last frame on the link (`Closing`), and its
//! messages to `P` wait, in order. `P` reads `Close` (so it read all of `E`'s link frames),
//! writes `CloseAck` as its last frame there (`Draining`) and its own messages to `E` wait.
//! `E` reads `CloseAck` (so it read all of `P`'s): its messages take the tree, it closes the
//! connection and sends `Shut` over the tree, on which `P`'s messages take the tree too. Two
//! ends evicting each other at once each answer the other's `Close` and finish on the answer
//! to their own. A close that hears nothing for `DIRECT_MARKER_POKES_MAX` request times, or
//! whose connection is lost first, releases what waits over the tree (a fault window, as any
//! lost link).
//! Reliable messages do not wait: RELM takes the tree at once (its chains keep the order).
//! The runtime's own messages that a daemon writes straight to another (rank 0's `Settled`,
//! a status answer, a contact lookup's answer) would go on the link's connection too: while
//! the link closes they wait with the user's messages and then take the tree, and once it is
//! fenced they take the tree at once ([`DirectLinks::ends`]; regression seed 66614).
//! Every message after the grant names the link's id (the grantor's): two daemons may open a
//! new link on the connection an earlier one used, and a `Close` of the earlier one read then
//! must not close the new one.
//!
//! # Bounds
//! Links asked for, granted or open: `direct_links_max`, and closing ones up to as many again;
//! messages waiting for a link to close: `limits::DIRECT_HELD_MAX` and
//! `limits::DIRECT_HELD_BYTES_MAX` per peer (beyond, a send fails `Busy`, or without a
//! completion is dropped and counted in `dropped_queue_full`); denials cached:
//! [`crate::limits::DIRECT_DENIALS_MAX`] (the oldest dropped), each for `direct_denial_ms`; destinations whose traffic the `auto`
//! policy counts: at most the DVM's size.

mod table;
pub mod wire;

pub use table::{Asker, DirectConfig, DirectLinks, Ending, LinkEvent, Via};
pub use wire::{DenyReason, DirectMsg, TAG_DIRECT};

use std::fmt;
use std::str::FromStr;

/// A daemon's route setting (`route`, `TBON_ROUTE`), with PVM's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum RouteSetting {
    /// Never ask for a direct link, and refuse requests (PVM's `PvmDontRoute`).
    #[default]
    Tree,
    /// Ask for a direct link to any daemon this one sends to (`PvmRouteDirect`).
    Direct,
    /// Ask once a destination took more than `direct_auto_messages` messages or
    /// `direct_auto_bytes` bytes within `direct_auto_window_ms`; grant requests (`PvmAllowDirect`).
    Auto,
}

impl fmt::Display for RouteSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteSetting::Tree => "tree",
            RouteSetting::Direct => "direct",
            RouteSetting::Auto => "auto",
        })
    }
}

impl FromStr for RouteSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tree" => Ok(RouteSetting::Tree),
            "direct" => Ok(RouteSetting::Direct),
            "auto" => Ok(RouteSetting::Auto),
            other => Err(format!("{other:?} is not a route (tree, direct or auto)")),
        }
    }
}

/// The route of one send, overriding the daemon's [`RouteSetting`] for the decision whether
/// to ask for a direct link to its destination.
///
/// It governs negotiation, not the path of that one message: a message never overtakes an
/// earlier one to the same destination, so once a direct link to the destination is open
/// every message to it takes the link (a `Tree` send included), and until it is open every
/// message takes the tree (a `Direct` send included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Route {
    /// Do not ask for a direct link because of this send (as the setting `tree` would).
    Tree,
    /// Ask for a direct link to the destination if none is open or asked for, unless a
    /// recent denial is cached (as the setting `direct` would).
    Direct,
}
