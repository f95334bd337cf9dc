//! Per-daemon counters, readable through [`crate::Handle::counters`].

/// A snapshot of one daemon's counters. Counts are since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Counters {
    /// Messages this daemon originated (including self-sends).
    pub sent: u64,
    /// Messages delivered to a receive on this daemon.
    pub delivered: u64,
    /// Plain messages for other daemons forwarded by this one (reliable ones are RELM's: see
    /// the `relm_*` counters). A batch frame (several small messages of one origin to one
    /// destination, `Handle::send_batch`) is forwarded, and counted, once.
    pub relayed: u64,
    /// Broadcast operations (`Op` messages, one per part of a payload split into parts) sent
    /// to children, replays included.
    pub xcast_forwarded: u64,
    /// Messages dropped because no route led to their destination.
    pub dropped_unreachable: u64,
    /// Frames without a sender here (relayed, broadcast copies, notices) dropped because the
    /// bounded queue towards their next hop was full (a peer that does not read).
    pub dropped_queue_full: u64,
    /// Held (unmatched) messages dropped to keep the unmatched list within its bound.
    pub dropped_unmatched: u64,
    /// Connections closed because the peer broke the protocol (bad frame, bad handshake).
    pub protocol_errors: u64,
    /// Contact lookups this daemon sent to rank 0 (retries included): dials of ranks whose
    /// contact wire-up did not give it.
    pub contact_lookups: u64,
    /// Outgoing connection attempts that were retried.
    pub reconnects: u64,
    /// Link sessions: new connections to a living neighbour on which frames written before a
    /// break were written again.
    pub link_resumes: u64,
    /// Link sessions: frames written again after a break (not confirmed on the old connection).
    pub link_frames_resent: u64,
    /// Link sessions: frames that arrived again after a break and were dropped (they had
    /// arrived before it).
    pub link_duplicates_dropped: u64,
    /// Link sessions: frames written and never confirmed that were given up because the
    /// neighbour no longer held the session (a frame of it broke the protocol there).
    pub link_frames_given_up: u64,
    /// Failover: connections closed as stalled (frames waiting for confirmation, nothing heard
    /// back for `link_stall_ms`) and dialled again at the peer's next address.
    pub link_failovers: u64,
    /// Streams: bulk connections this daemon dialled to a neighbour and had admitted (a second
    /// connection that carries only its stream data to that neighbour; setting
    /// `bulk_connection`).
    pub bulk_connections: u64,
    /// Link sessions: resumptions that skipped frames this daemon never had (cannot happen
    /// between correct peers; logged).
    pub link_gaps: u64,
    /// Commands received from other threads; a `send_batch` counts one per message it carries
    /// (so that this counter says how much work the callers handed the loop).
    pub commands: u64,
    /// Wake-up system calls paid to rouse the loop (at most one per command; far fewer in bursts).
    pub wakeups: u64,
    /// Frames dropped because they came from (or over a link from) a rank known to have
    /// failed: stale traffic of a daemon the DVM declared dead.
    pub dropped_stale: u64,
    /// Frames dropped because they carried an older incarnation of their sender than one
    /// already seen (left over from before the sender restarted).
    pub dropped_old_incarnation: u64,
    /// Fault reports that waited for room in RELM's window (delayed, never dropped).
    pub reports_delayed: u64,
    /// Repairs of the routing tree (local and global scope each count).
    pub repairs: u64,
    /// Ranks this daemon put back into the tree: daemons restarted under a dead rank and
    /// admitted again (issue "Rejoin").
    pub rejoins: u64,
    /// Ranks that left the DVM in order (`Handle::leave`) and that this daemon repaired around
    /// (counted once each, at rank 0's confirmation).
    pub departures: u64,
    /// Routed messages dropped because they were sent by, or for, another incarnation of their
    /// origin or destination than the one this daemon knows (rejoin; see `Header::lives`).
    pub dropped_other_life: u64,
    /// Rank 0: rejoin requests it refused (the rank alive, an old incarnation, too many at
    /// once, ...), and wire-up reports of a second daemon for a living rank.
    pub rejoins_refused: u64,
    /// Ranks this daemon knows have failed, ascending.
    pub failed: Vec<u32>,
    /// Connections currently open (established or handshaking).
    pub connections: u64,
    /// The loop's current parent (lifeline) in the tree.
    pub parent: Option<u32>,
    /// The loop's current children in the tree.
    pub children: Vec<u32>,
    /// The DVM epoch this daemon knows: rank 0 increments it with every confirmation of
    /// deaths.
    pub epoch: u64,
    /// Reliable messages originated here (self-sends excluded: they are posted locally).
    pub relm_sent: u64,
    /// Reliable messages from other daemons posted here (handed to receive matching), each
    /// once (self-sends excluded, as in `relm_sent`: they are delivered locally).
    pub relm_posted: u64,
    /// Copies of reliable messages discarded here as already posted.
    pub relm_duplicates: u64,
    /// Reliable messages this daemon retransmitted as their origin (timer or repair).
    pub relm_retransmits: u64,
    /// Reliable messages replayed from this daemon's record on a neighbour's request.
    pub relm_replays: u64,
    /// RELM updates ignored: not from the message's current upstream or downstream
    /// neighbour, or a link update with a stale depth.
    pub relm_ignored: u64,
    /// Reliable messages evicted from this daemon's hop cache (by age or count). Normal on a
    /// busy relay: the cache keeps the last `relm_cache_max` messages for replays, and the
    /// origin keeps every message until it is acknowledged, so an eviction loses nothing.
    pub relm_evicted: u64,
    /// Reliable messages refused here: early ones beyond `relm_pending_max`, or ones the full
    /// unmatched list could not hold. Not acknowledged; their origin replays them.
    pub relm_refused: u64,
    /// RELM link updates this daemon sent after repairs and reconnections.
    pub relm_link_updates: u64,
    /// Reliable messages for other daemons this one forwarded as an intermediate hop (copies
    /// included; an origin's messages on a direct link cross no hop).
    pub relm_relayed: u64,
    /// Reliable messages originated here and not yet acknowledged (at most
    /// `relm_unacked_max`).
    pub relm_unacked: u64,
    /// Reliable messages held in this daemon's hop cache for replay.
    pub relm_cached: u64,
    /// Early reliable messages held here while their predecessor is missing.
    pub relm_pending: u64,
    /// Broadcasts delivered here (user broadcasts and the DVM's own notices), each once, in
    /// operation order; a payload split into parts counts once.
    pub xcast_delivered: u64,
    /// Broadcasts the application originated here that completed: every living daemon
    /// delivered them (rank 0's own notices are not counted).
    pub xcast_completed: u64,
    /// Broadcasts originated here that rank 0 refused (a payload too large for it): `Busy`.
    pub xcast_refused: u64,
    /// Rank 0: broadcast requests it refused (payload too large; a full window holds them).
    pub xcast_requests_refused: u64,
    /// Rank 0: broadcast requests (its own included) that waited for room in its window
    /// (`limits::XCAST_INFLIGHT_MAX`) instead of being numbered at once.
    pub xcast_requests_held: u64,
    /// Broadcast operations received again (already held or delivered) and ignored.
    pub xcast_duplicates: u64,
    /// Broadcast operations ignored because they came from a rank that is not this daemon's
    /// parent (a neighbour whose view of the tree differed for a moment).
    pub xcast_not_from_parent: u64,
    /// `Resume` messages sent to the parent (after a repair, a gap or a lost link).
    pub xcast_resumes: u64,
    /// Broadcast operations dropped at the retained bound (fetched again later).
    pub xcast_dropped_full: u64,
    /// Collective tree messages ignored as stale (from a rank that is no neighbour in this
    /// view, for an unknown request, ...).
    pub xcast_stale: u64,
    /// Broadcast operations held here: not yet delivered, or kept for children.
    pub xcast_retained: u64,
    /// Broadcasts originated here awaiting rank 0's answer (always 0 on rank 0).
    pub xcast_outstanding: u64,
    /// Allgather contributions sent to the parent (re-sends after repairs included).
    pub allgather_sent: u64,
    /// Allgather contributions received from children.
    pub allgather_received: u64,
    /// Allgather contributions received under another view of the tree (merged, counted once
    /// the child re-sends under this one).
    pub allgather_other_view: u64,
    /// Allgather contributions that arrived after the collective's result.
    pub allgather_late: u64,
    /// Allgathers that exceeded `limits::ALLGATHER_MAX_BYTES` here.
    pub allgather_overflowed: u64,
    /// Allgather contributions dropped because too many collectives had state here.
    pub allgather_dropped_untracked: u64,
    /// Allgather (and barrier) results delivered here.
    pub allgather_results: u64,
    /// Collectives this daemon keeps state for.
    pub allgather_tracked: u64,
    /// Group collective contributions sent to the parent (re-sends included).
    pub group_sent: u64,
    /// Group collective contributions received from children.
    pub group_received: u64,
    /// Group collective results sent to children (passed down or answered).
    pub group_results_sent: u64,
    /// Group contributions that arrived after the collective finished here (answered from
    /// the cache of recent results, or "lost").
    pub group_answered_late: u64,
    /// Group contributions dropped because too many group collectives had state here.
    pub group_dropped_untracked: u64,
    /// Group collective results delivered here (this daemon a member).
    pub group_results: u64,
    /// Group collectives this daemon keeps state for (its own and those it relays).
    pub group_tracked: u64,
    /// Data-exchange gets answered here without a message (cache or own data).
    pub modex_hits: u64,
    /// Data-exchange fetches of an owner's data (one per owner and group, shared by the gets
    /// waiting for it).
    pub modex_fetches: u64,
    /// Data-exchange fetches answered for other daemons.
    pub modex_served: u64,
    /// Blobs evicted from the data-exchange cache.
    pub modex_evicted: u64,
    /// Times a link's collective messages were re-stated: a tree neighbour's connection came
    /// back, or messages for it were dropped at its full queue.
    pub grpcomm_resyncs: u64,
    /// Collective messages that did not decode. As a frame, its connection was closed (also
    /// counted in `protocol_errors`); over RELM, the message was dropped.
    pub grpcomm_malformed: u64,
    /// Accepted connections still in their handshake closed to make room under the
    /// pending-handshake bounds (`limits::PENDING_HANDSHAKES_PER_SOURCE_MAX`,
    /// `limits::PENDING_HANDSHAKES_MAX`): the oldest pending one goes.
    pub handshakes_evicted: u64,
    /// Connections closed because their handshake did not finish within
    /// `handshake_timeout_ms`.
    pub handshakes_timed_out: u64,
    /// Accepted connections whose peer hung up before proving it holds the job key (a
    /// stranger; or a daemon that gave up its dial, e.g. because ours to it crossed it: then
    /// not counted in `protocol_errors` either).
    pub handshakes_abandoned: u64,
    /// Connections refused in their handshake for what they sent (wrong DVM, wrong MAC,
    /// malformed or unexpected frames), or at accept beyond `limits::CONNECTIONS_MAX`. Each
    /// refusal is counted once.
    pub handshakes_refused: u64,
    /// Refusal log lines not written because of the rate limit
    /// (`limits::REFUSAL_LOG_LINES_PER_INTERVAL`); summarised per reason instead.
    pub log_lines_suppressed: u64,
    /// Times a send queue towards a neighbour became congested (above
    /// `limits::FLOW_HIGH_BYTES`): reads from the other neighbours paused until it drained.
    pub flow_congested: u64,
    /// Sends of this daemon's callers refused `Busy` by flow control (back-pressure; the caller
    /// retries): the queue towards their next hop was congested (`Limit::NextHopQueue`), or
    /// the command queue already held its share of payload bytes
    /// (`limits::COMMAND_QUEUE_MAX_BYTES`, or a quarter of `send_queue_max_bytes`: reported as
    /// `Limit::CommandChannel`).
    pub sends_busy_flow: u64,
    /// Reliable sends of this daemon's callers refused `Busy` at the call because
    /// `relm_unacked_max` of their reliable messages were unacknowledged (back-pressure; the
    /// caller retries).
    pub relm_busy: u64,
    /// Direct links (`route` setting; see [`crate::direct`]).
    pub direct: DirectCounters,
    /// Streams (see [`crate::stream`]).
    pub streams: StreamCounters,
    /// Clients routed through this daemon (see [`crate::clients`]).
    pub clients: crate::clients::registry::ClientCounters,
}

/// The stream counters of one daemon ([`Counters::streams`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StreamCounters {
    /// Producer: streams opened here by consumers (a resumed stream opens again).
    pub served: u64,
    /// Producer: opens refused (no such service, no room for another stream).
    pub refused: u64,
    /// Producer: data bytes sent (resent bytes of a resumed stream included).
    pub bytes_sent: u64,
    /// Consumer: streams fetched here.
    pub fetched: u64,
    /// Consumer: streams that finished (every byte arrived and checked).
    pub finished: u64,
    /// Consumer: streams that ended with an error (cancels included). A `Stream` reader
    /// checks each chunk's digest as it takes it: one that finds a chunk corrupt after the
    /// daemon saw the stream's end (and counted it `finished`) is counted here too.
    pub failed: u64,
    /// Consumer: times a stream resumed at the byte it stood at (a relay died, a link was
    /// lost, a gap, data or an end a probe found lost).
    pub resumes: u64,
    /// Consumer: probes sent (a quarter of the stream's idle time without news: the producer
    /// answers where it stands, and the stream resumes only if something was lost).
    pub probes: u64,
    /// Consumer: data bytes received in order and handed towards the application: a
    /// `Stream` reader's queue counts too, so this runs up to a window ahead of what the
    /// application has read (and a reader-checked chunk is checked by the reader's thread,
    /// after it is counted here).
    pub bytes_received: u64,
    /// Streams open now: produced here, and fetched here.
    pub producing: u64,
    /// Streams fetched here, open now.
    pub consuming: u64,
}

/// The direct-link counters of one daemon ([`Counters::direct`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DirectCounters {
    /// Requests for a direct link this daemon sent.
    pub requests_sent: u64,
    /// Requests other daemons sent this one.
    pub requests_received: u64,
    /// Requests this daemon granted.
    pub grants: u64,
    /// Requests this daemon denied (a crossed request, answered by a grant the other way, is
    /// not counted).
    pub denials_sent: u64,
    /// Denials this daemon's requests met, by reason: the grantor's `route` is `tree`.
    pub denied_policy: u64,
    /// ... the grantor speaks another negotiation version.
    pub denied_version: u64,
    /// ... the grantor had no room under its `direct_links_max`.
    pub denied_full: u64,
    /// ... the two disagreed on the DVM epoch (a repair under way), or the grantor was
    /// stopping, or the two were tree neighbours.
    pub denied_other: u64,
    /// ... the grantor died or was known dead.
    pub denied_dead: u64,
    /// ... no answer within `direct_request_ms`.
    pub denied_timeout: u64,
    /// Sends that would have asked for a link but found a recent denial of it cached.
    pub denial_cache_hits: u64,
    /// Sends that would have asked for a link but found no room under `direct_links_max`.
    pub no_room: u64,
    /// Links that opened (both ways on the link).
    pub links_opened: u64,
    /// Links in use now (granted or open).
    pub links_open: u64,
    /// Links that fell back to the tree (the connection was lost, or a grant was withdrawn).
    pub fallbacks: u64,
    /// Idle links this daemon closed to make room for a new one (least recently used first).
    pub links_evicted: u64,
    /// User messages originated here that took a direct link, and their payload bytes. A
    /// stream's own messages count too, by the route they took: a consumer's credit and a
    /// producer's data (streams travel as messages of runtime tag 14).
    pub direct_messages: u64,
    /// Payload bytes of `direct_messages`.
    pub direct_bytes: u64,
    /// User messages originated here for daemons that are not tree neighbours that took the
    /// tree, and their payload bytes (a stream's own messages too, as for
    /// `direct_messages`).
    pub tree_messages: u64,
    /// Payload bytes of `tree_messages`.
    pub tree_bytes: u64,
}

impl DirectCounters {
    /// Counts a denial this daemon's request met.
    pub(crate) fn count_denial(&mut self, r: crate::direct::DenyReason) {
        use crate::direct::DenyReason::*;
        match r {
            Policy => self.denied_policy += 1,
            Version => self.denied_version += 1,
            Full => self.denied_full += 1,
            PeerDead => self.denied_dead += 1,
            Timeout | Unreachable => self.denied_timeout += 1,
            Epoch | Neighbour | Stopping | Crossed => self.denied_other += 1,
        }
    }
}
