//! Exhaustive check of the rule with the real handshake: two daemons that may each dial the
//! other (and dial again when a dial fails), plus a stranger without the key who opens
//! connections claiming a rank, sends `Hello`s and forged `Auth`s, and leaves; every
//! interleaving of every frame is explored. Each side of each connection runs the real
//! [`Handshake`] (real frames, real MACs); the daemons decide with the real [`admit`]. States
//! are told apart by what matters (handshake phases, frames in flight, link tables), not by
//! nonces.

use super::*;
use crate::oob::frame::Frame;
use crate::oob::handshake::{Handshake, HandshakeConfig, HandshakeEvent, JobKey, NONCE_LEN};
use crate::oob::header::{Header, Kind};
use std::collections::{HashSet, VecDeque};

#[derive(Debug, Clone)]
enum Msg {
    Frame(Frame),
    Eof,
}

impl Msg {
    fn key(&self) -> u8 {
        match self {
            Msg::Frame(f) => u8::from(f.header.kind),
            Msg::Eof => 0,
        }
    }
}

/// One end of a connection: its handshake, and whether that end still has it open.
#[derive(Debug, Clone)]
struct End {
    hs: Handshake,
    open: bool,
}

#[derive(Debug, Clone)]
struct Conn {
    /// Index of the dialling daemon (0 or 1); for a stranger's connection, the daemon whose
    /// rank it claims.
    dialler: usize,
    acceptor: usize,
    stranger: bool,
    forged: bool,
    d: End,
    a: End,
    to_acceptor: VecDeque<Msg>,
    to_dialler: VecDeque<Msg>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Daemon {
    rank: Rank,
    wants: bool,
    may_want: bool,
    dials_left: u8,
    link: Option<(usize, LinkDialler)>,
    dial: Option<usize>,
}

#[derive(Debug, Clone)]
struct World {
    daemons: [Daemon; 2],
    conns: Vec<Conn>,
    strangers_left: u8,
    next_nonce: u64,
}

/// What tells two worlds apart for the search.
type ConnKey = (
    usize,
    usize,
    bool,
    bool,
    Option<&'static str>,
    Option<&'static str>,
    Vec<u8>,
    Vec<u8>,
);
type Key = (Vec<ConnKey>, [Daemon; 2], u8);

#[derive(Debug, Clone, Copy)]
enum Event {
    Want(usize),
    Dial(usize),
    StrangerHello(usize),
    StrangerForgesAuth(usize),
    StrangerLeaves(usize),
    HandshakeTimeout(usize),
    ToAcceptor(usize),
    ToDialler(usize),
}

const SIZE: u32 = 16;

fn cfg(me: Rank) -> HandshakeConfig {
    HandshakeConfig {
        me,
        size: SIZE,
        epoch: u64::from(me) + 1,
        dvm_id: "model".into(),
        key: JobKey::new(*b"the model's job key, 32 bytes..."),
    }
}

fn stranger_cfg(claims: Rank) -> HandshakeConfig {
    HandshakeConfig {
        key: JobKey::new(*b"a stranger's guess at the key"),
        ..cfg(claims)
    }
}

impl World {
    fn new(ranks: [Rank; 2], wants: [bool; 2], strangers: u8) -> World {
        let daemon = |i: usize| Daemon {
            rank: ranks[i],
            wants: wants[i],
            may_want: true,
            dials_left: 2,
            link: None,
            dial: None,
        };
        World {
            daemons: [daemon(0), daemon(1)],
            conns: Vec::new(),
            strangers_left: strangers,
            next_nonce: 1,
        }
    }

    fn key(&self) -> Key {
        let conns = self
            .conns
            .iter()
            .map(|c| {
                (
                    c.dialler,
                    c.acceptor,
                    c.stranger,
                    c.forged,
                    c.d.open.then(|| c.d.hs.phase()),
                    c.a.open.then(|| c.a.hs.phase()),
                    c.to_acceptor.iter().map(Msg::key).collect(),
                    c.to_dialler.iter().map(Msg::key).collect(),
                )
            })
            .collect();
        (conns, self.daemons.clone(), self.strangers_left)
    }

    fn nonce(&mut self) -> [u8; NONCE_LEN] {
        self.next_nonce += 1;
        let mut n = [0x5a; NONCE_LEN];
        n[..8].copy_from_slice(&self.next_nonce.to_le_bytes());
        n
    }

    fn events(&self) -> Vec<Event> {
        let mut out = Vec::new();
        for (i, d) in self.daemons.iter().enumerate() {
            if !d.wants && d.may_want {
                out.push(Event::Want(i));
            }
            if d.wants && d.link.is_none() && d.dial.is_none() && d.dials_left > 0 {
                out.push(Event::Dial(i));
            }
            if self.strangers_left > 0 {
                out.push(Event::StrangerHello(i));
            }
        }
        for (c, conn) in self.conns.iter().enumerate() {
            if !conn.to_acceptor.is_empty() {
                out.push(Event::ToAcceptor(c));
            }
            if !conn.to_dialler.is_empty() {
                out.push(Event::ToDialler(c));
            }
            if conn.stranger && conn.d.open {
                out.push(Event::StrangerLeaves(c));
                if !conn.forged {
                    out.push(Event::StrangerForgesAuth(c));
                }
            }
            if conn.stranger && conn.a.open {
                out.push(Event::HandshakeTimeout(c));
            }
        }
        out
    }

    /// A new connection from `dialler_hs` to daemon `acceptor`.
    fn connect(&mut self, dialler: usize, acceptor: usize, stranger: bool, mut hs: Handshake) {
        let to_acceptor = std::iter::from_fn(|| hs.poll_transmit())
            .map(|(header, payload)| Msg::Frame(Frame { header, payload }))
            .collect();
        let nonce = self.nonce();
        let rank = self.daemons[acceptor].rank;
        self.conns.push(Conn {
            dialler,
            acceptor,
            stranger,
            forged: false,
            d: End { hs, open: true },
            a: End {
                hs: Handshake::accept(&cfg(rank), nonce),
                open: true,
            },
            to_acceptor,
            to_dialler: VecDeque::new(),
        });
    }

    /// Moves what the acceptor (or dialler) of `c` has queued onto the wire.
    fn flush(&mut self, c: usize) {
        let conn = &mut self.conns[c];
        while let Some((header, payload)) = conn.a.hs.poll_transmit() {
            conn.to_dialler
                .push_back(Msg::Frame(Frame { header, payload }));
        }
        while let Some((header, payload)) = conn.d.hs.poll_transmit() {
            conn.to_acceptor
                .push_back(Msg::Frame(Frame { header, payload }));
        }
    }

    /// Applies one event; `Err` names a broken rule.
    fn step(&mut self, e: Event) -> Result<(), String> {
        match e {
            Event::Want(i) => {
                self.daemons[i].wants = true;
                self.daemons[i].may_want = false;
            }
            Event::Dial(i) => {
                let (me, peer) = (self.daemons[i].rank, self.daemons[1 - i].rank);
                let nonce = self.nonce();
                let d = &mut self.daemons[i];
                d.dials_left -= 1;
                d.dial = Some(self.conns.len());
                self.connect(i, 1 - i, false, Handshake::dial(&cfg(me), peer, nonce));
            }
            Event::StrangerHello(i) => {
                // Claims the other daemon's rank; holds another key.
                self.strangers_left -= 1;
                let (claims, target) = (self.daemons[1 - i].rank, self.daemons[i].rank);
                let nonce = self.nonce();
                let hs = Handshake::dial(&stranger_cfg(claims), target, nonce);
                self.connect(1 - i, i, true, hs);
            }
            Event::StrangerForgesAuth(c) => {
                let conn = &mut self.conns[c];
                conn.forged = true;
                let header = Header {
                    kind: Kind::Auth,
                    origin: self.daemons[conn.dialler].rank,
                    dst: self.daemons[conn.acceptor].rank,
                    tag: 0,
                    epoch: 0,
                    seq: 0,
                    len: 32,
                    lives: 0,
                };
                let payload = bytes::Bytes::from(vec![7u8; 32]);
                conn.to_acceptor
                    .push_back(Msg::Frame(Frame { header, payload }));
            }
            Event::StrangerLeaves(c) => {
                self.conns[c].d.open = false;
                self.conns[c].to_acceptor.push_back(Msg::Eof);
            }
            Event::HandshakeTimeout(c) => {
                let x = self.conns[c].acceptor;
                self.close(x, c)?;
            }
            Event::ToAcceptor(c) => {
                let m = self.conns[c].to_acceptor.pop_front().ok_or("empty")?;
                self.at_acceptor(c, m)?;
            }
            Event::ToDialler(c) => {
                let m = self.conns[c].to_dialler.pop_front().ok_or("empty")?;
                self.at_dialler(c, m)?;
            }
        }
        Ok(())
    }

    fn at_acceptor(&mut self, c: usize, m: Msg) -> Result<(), String> {
        if !self.conns[c].a.open {
            return Ok(());
        }
        let x = self.conns[c].acceptor;
        let f = match m {
            Msg::Eof => return self.eof(x, c),
            Msg::Frame(f) => f,
        };
        match self.conns[c].a.hs.handle_frame(f) {
            Ok(None) => {
                self.flush(c);
                Ok(())
            }
            Ok(Some(HandshakeEvent::HelloReceived(_))) => {
                // Answered, and nothing else: no link state looks at an unproven Hello.
                self.conns[c].a.hs.try_accept_peer();
                self.flush(c);
                Ok(())
            }
            Ok(Some(HandshakeEvent::Authenticated(p))) => {
                if self.conns[c].stranger {
                    return Err("a stranger's connection proved the key".into());
                }
                if p.rank != self.daemons[1 - x].rank {
                    return Err(format!("authenticated as rank {}", p.rank));
                }
                self.decide(x, c)
            }
            Ok(Some(HandshakeEvent::Established(_))) => {
                Err("an acceptor established without admitting".into())
            }
            Err(e) if self.conns[c].stranger => {
                // Refused: the daemon closes the stranger's connection.
                let _ = e;
                self.close(x, c)
            }
            Err(e) => Err(format!("a daemon's handshake failed at the acceptor: {e}")),
        }
    }

    /// The acceptor `x` applies the rule to the proved connection `c`.
    fn decide(&mut self, x: usize, c: usize) -> Result<(), String> {
        let me = &self.daemons[x];
        let peer = self.daemons[1 - x].rank;
        let link = me.link.map(|(_, w)| w);
        let dial = match me.dial.map(|d| &self.conns[d].d) {
            None => None,
            Some(end) if end.hs.is_established() => {
                return Err("an established dial that is not the link".into());
            }
            Some(end) if end.hs.has_sent_proof() => Some(DialPhase::ProofSent),
            Some(_) => Some(DialPhase::Unproven),
        };
        match admit(me.rank, peer, link, dial) {
            Admission::Admit {
                close_dial,
                replace_link,
            } => {
                if replace_link {
                    // Nobody here loses a link, so nobody dials again over one.
                    return Err("a live link was replaced".into());
                }
                if close_dial && let Some(d) = self.daemons[x].dial {
                    self.close(x, d)?;
                }
                if !self.conns[c].a.hs.admit() {
                    return Err("admit refused by the handshake".into());
                }
                self.flush(c);
                if self.daemons[x].link.is_some() {
                    return Err("two links".into());
                }
                self.daemons[x].link = Some((c, LinkDialler::There));
                Ok(())
            }
            Admission::Refuse { .. } => self.close(x, c),
        }
    }

    fn at_dialler(&mut self, c: usize, m: Msg) -> Result<(), String> {
        if !self.conns[c].d.open || self.conns[c].stranger {
            // A stranger reads what it is sent and can do nothing with it.
            return Ok(());
        }
        let x = self.conns[c].dialler;
        let f = match m {
            Msg::Eof => return self.eof(x, c),
            Msg::Frame(f) => f,
        };
        match self.conns[c].d.hs.handle_frame(f) {
            Ok(None) => {
                // The acceptor proved the key; the Auth goes out.
                self.flush(c);
                Ok(())
            }
            Ok(Some(HandshakeEvent::Established(_))) => {
                let me = &mut self.daemons[x];
                if me.link.is_some() {
                    return Err("two links".into());
                }
                if me.dial != Some(c) {
                    return Err("Ready on a connection that is not the dial".into());
                }
                me.dial = None;
                me.link = Some((c, LinkDialler::Here));
                Ok(())
            }
            other => Err(format!("dialler: {other:?}")),
        }
    }

    /// Daemon `x` closes its end of `c`.
    fn close(&mut self, x: usize, c: usize) -> Result<(), String> {
        let conn = &mut self.conns[c];
        let (mine, theirs) = if conn.acceptor == x && conn.a.open {
            conn.a.open = false;
            conn.to_dialler.push_back(Msg::Eof);
            (&conn.a, &conn.d)
        } else if conn.dialler == x && !conn.stranger && conn.d.open {
            conn.d.open = false;
            conn.to_acceptor.push_back(Msg::Eof);
            (&conn.d, &conn.a)
        } else {
            return Err(format!("daemon {x} closed connection {c} twice"));
        };
        if mine.hs.is_established() || (theirs.open && theirs.hs.is_established()) {
            return Err(format!("daemon {x} closed established connection {c}"));
        }
        let d = &mut self.daemons[x];
        if d.dial == Some(c) {
            d.dial = None;
        }
        Ok(())
    }

    /// Daemon `x` reads the end of `c`.
    fn eof(&mut self, x: usize, c: usize) -> Result<(), String> {
        let conn = &mut self.conns[c];
        let end = if conn.acceptor == x {
            &mut conn.a
        } else {
            &mut conn.d
        };
        end.open = false;
        if end.hs.is_established() {
            return Err(format!(
                "daemon {x}'s established connection {c} was closed"
            ));
        }
        let d = &mut self.daemons[x];
        if d.dial == Some(c) {
            // A failed dial: dialled again while the daemon still wants the link.
            d.dial = None;
        }
        Ok(())
    }

    /// At the end: whoever wanted a link has it, both on one connection, established on both
    /// sides; no stranger's connection got anywhere.
    fn check_final(&self) -> Result<(), String> {
        if self
            .conns
            .iter()
            .any(|c| c.stranger && (c.a.hs.is_established() || c.a.hs.phase() == "admitting"))
        {
            return Err("a stranger's connection was admitted".into());
        }
        let wanted = self.daemons.iter().any(|d| d.wants);
        let [a, b] = &self.daemons;
        match (a.link, b.link) {
            (Some((ca, _)), Some((cb, _))) if ca == cb => {
                let c = &self.conns[ca];
                let both = c.a.open && c.d.open;
                if !both || !c.a.hs.is_established() || !c.d.hs.is_established() {
                    return Err(format!("link {ca} not established on both sides"));
                }
                Ok(())
            }
            (None, None) if !wanted => Ok(()),
            other => Err(format!("no agreed link at the end: {other:?}")),
        }
    }
}

/// Explores every interleaving from `start`; returns how many states were seen.
fn explore(start: World) -> usize {
    let mut seen = HashSet::new();
    let mut stack = vec![(start, Vec::new())];
    while let Some((w, trace)) = stack.pop() {
        if !seen.insert(w.key()) {
            continue;
        }
        let events = w.events();
        if events.is_empty() {
            if let Err(e) = w.check_final() {
                panic!("{e}\ntrace: {trace:?}\nworld: {w:#?}");
            }
            continue;
        }
        for e in events {
            let mut next = w.clone();
            let mut t: Vec<Event> = trace.clone();
            t.push(e);
            if let Err(why) = next.step(e) {
                panic!("{why}\ntrace: {t:?}\nworld: {next:#?}");
            }
            stack.push((next, t));
        }
    }
    seen.len()
}

#[test]
fn two_daemons_always_agree_on_one_link_and_never_close_an_admitted_one() {
    let mut states = 0;
    for wants in [[true, false], [false, true], [true, true], [false, false]] {
        states += explore(World::new([3, 8], wants, 0));
    }
    assert!(states > 300, "explored only {states} states");
}

#[test]
fn a_strangers_hellos_and_forged_proofs_change_no_outcome() {
    // One stranger's connection, to either daemon at any moment, claiming the other's rank.
    // (Two take over a hundred times as long and find nothing more: a Hello changes no state.)
    for wants in [[true, false], [false, true], [true, true]] {
        explore(World::new([3, 8], wants, 1));
    }
}

#[test]
fn the_rule_table() {
    use DialPhase::*;
    use LinkDialler::*;
    let admit_ = |close_dial, replace_link| Admission::Admit {
        close_dial,
        replace_link,
    };
    // 8 is the higher rank: its dial wins when proofs cross.
    assert_eq!(admit(8, 3, None, None), admit_(false, false));
    assert_eq!(admit(8, 3, None, Some(Unproven)), admit_(true, false));
    assert_eq!(
        admit(8, 3, None, Some(ProofSent)),
        Admission::Refuse { probe_link: false }
    );
    assert_eq!(admit(3, 8, None, Some(ProofSent)), admit_(true, false));
    assert_eq!(
        admit(8, 3, Some(Here), None),
        Admission::Refuse { probe_link: true }
    );
    assert_eq!(admit(3, 8, Some(Here), None), admit_(false, true));
    assert_eq!(admit(8, 3, Some(There), None), admit_(false, true));
    assert_eq!(admit(3, 8, Some(There), None), admit_(false, true));
    // A quiet link the peer dials again: it gave the link up (a failover); replaced whoever wins.
    assert_eq!(admit(8, 3, Some(HereQuiet), None), admit_(false, true));
    assert_eq!(
        admit(8, 3, Some(HereQuiet), Some(ProofSent)),
        admit_(true, true)
    );
}
