//! Exhaustive check of the rule: two daemons that may each dial the other (and dial again when
//! a dial fails), plus a stranger who opens connections claiming a rank and never proves it,
//! every interleaving of every frame explored. The handshake is reduced to its phases (its
//! MACs are `handshake`'s own tests); the decision is the real [`admit`].

use super::*;
use std::collections::{HashSet, VecDeque};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Frame {
    Hello,
    HelloAck,
    Auth,
    Ready,
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DialSide {
    AwaitAck,
    AwaitReady,
    Established,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AcceptSide {
    AwaitHello,
    AwaitAuth,
    Established,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Conn {
    /// Index of the dialling daemon (0 or 1), unused for a stranger's connection.
    dialler: usize,
    acceptor: usize,
    stranger: bool,
    /// `None`: that side has closed the connection.
    d: Option<DialSide>,
    a: Option<AcceptSide>,
    to_acceptor: VecDeque<Frame>,
    to_dialler: VecDeque<Frame>,
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    daemons: [Daemon; 2],
    conns: Vec<Conn>,
    strangers_left: u8,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Want(usize),
    Dial(usize),
    StrangerHello(usize),
    StrangerLeaves(usize),
    HandshakeTimeout(usize),
    ToAcceptor(usize),
    ToDialler(usize),
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
        }
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
            if conn.stranger && conn.d.is_some() {
                out.push(Event::StrangerLeaves(c));
            }
            if conn.stranger && conn.a.is_some() {
                out.push(Event::HandshakeTimeout(c));
            }
        }
        out
    }

    /// Applies one event; `Err` names a broken rule.
    fn step(&mut self, e: Event) -> Result<(), String> {
        match e {
            Event::Want(i) => {
                self.daemons[i].wants = true;
                self.daemons[i].may_want = false;
            }
            Event::Dial(i) => {
                let d = &mut self.daemons[i];
                d.dials_left -= 1;
                d.dial = Some(self.conns.len());
                self.conns.push(Conn {
                    dialler: i,
                    acceptor: 1 - i,
                    stranger: false,
                    d: Some(DialSide::AwaitAck),
                    a: Some(AcceptSide::AwaitHello),
                    to_acceptor: VecDeque::from([Frame::Hello]),
                    to_dialler: VecDeque::new(),
                });
            }
            Event::StrangerHello(i) => {
                // Claims the other daemon's rank; never proves it.
                self.strangers_left -= 1;
                self.conns.push(Conn {
                    dialler: 1 - i,
                    acceptor: i,
                    stranger: true,
                    d: Some(DialSide::AwaitAck),
                    a: Some(AcceptSide::AwaitHello),
                    to_acceptor: VecDeque::from([Frame::Hello]),
                    to_dialler: VecDeque::new(),
                });
            }
            Event::StrangerLeaves(c) => {
                self.conns[c].d = None;
                self.conns[c].to_acceptor.push_back(Frame::Eof);
            }
            Event::HandshakeTimeout(c) => {
                let x = self.conns[c].acceptor;
                self.close(x, c)?;
            }
            Event::ToAcceptor(c) => {
                let f = self.conns[c].to_acceptor.pop_front().ok_or("empty")?;
                self.at_acceptor(c, f)?;
            }
            Event::ToDialler(c) => {
                let f = self.conns[c].to_dialler.pop_front().ok_or("empty")?;
                self.at_dialler(c, f)?;
            }
        }
        Ok(())
    }

    fn at_acceptor(&mut self, c: usize, f: Frame) -> Result<(), String> {
        let Some(side) = self.conns[c].a else {
            return Ok(());
        };
        let x = self.conns[c].acceptor;
        match (f, side) {
            (Frame::Eof, _) => self.eof(x, c),
            (Frame::Hello, AcceptSide::AwaitHello) => {
                // Answered, and nothing else: no link state looks at an unproven Hello.
                self.conns[c].a = Some(AcceptSide::AwaitAuth);
                self.conns[c].to_dialler.push_back(Frame::HelloAck);
                Ok(())
            }
            (Frame::Auth, AcceptSide::AwaitAuth) => {
                if self.conns[c].stranger {
                    return Err("a stranger's connection proved the key".into());
                }
                let me = &self.daemons[x];
                let peer = self.daemons[1 - x].rank;
                let link = me.link.map(|(_, w)| w);
                let dial = match me.dial.map(|d| self.conns[d].d) {
                    None => None,
                    Some(Some(DialSide::AwaitAck)) => Some(DialPhase::Unproven),
                    Some(Some(DialSide::AwaitReady)) => Some(DialPhase::ProofSent),
                    Some(other) => return Err(format!("a dial in state {other:?}")),
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
                        self.conns[c].a = Some(AcceptSide::Established);
                        self.conns[c].to_dialler.push_back(Frame::Ready);
                        if self.daemons[x].link.is_some() {
                            return Err("two links".into());
                        }
                        self.daemons[x].link = Some((c, LinkDialler::There));
                        Ok(())
                    }
                    Admission::Refuse { .. } => self.close(x, c),
                }
            }
            (f, s) => Err(format!("acceptor got {f:?} in {s:?}")),
        }
    }

    fn at_dialler(&mut self, c: usize, f: Frame) -> Result<(), String> {
        let Some(side) = self.conns[c].d else {
            return Ok(());
        };
        if self.conns[c].stranger {
            // The stranger reads what it is sent and can do nothing with it.
            return Ok(());
        }
        let x = self.conns[c].dialler;
        match (f, side) {
            (Frame::Eof, _) => self.eof(x, c),
            (Frame::HelloAck, DialSide::AwaitAck) => {
                self.conns[c].d = Some(DialSide::AwaitReady);
                self.conns[c].to_acceptor.push_back(Frame::Auth);
                Ok(())
            }
            (Frame::Ready, DialSide::AwaitReady) => {
                self.conns[c].d = Some(DialSide::Established);
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
            (f, s) => Err(format!("dialler got {f:?} in {s:?}")),
        }
    }

    /// Daemon `x` closes its side of `c`.
    fn close(&mut self, x: usize, c: usize) -> Result<(), String> {
        let conn = &mut self.conns[c];
        let (mine_established, theirs_established) = if conn.acceptor == x {
            let was = conn.a == Some(AcceptSide::Established);
            conn.a = None;
            conn.to_dialler.push_back(Frame::Eof);
            (was, conn.d == Some(DialSide::Established))
        } else {
            let was = conn.d == Some(DialSide::Established);
            conn.d = None;
            conn.to_acceptor.push_back(Frame::Eof);
            (was, conn.a == Some(AcceptSide::Established))
        };
        if mine_established || theirs_established {
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
        let side_established = if conn.acceptor == x {
            let was = conn.a == Some(AcceptSide::Established);
            conn.a = None;
            was
        } else {
            let was = conn.d == Some(DialSide::Established);
            conn.d = None;
            was
        };
        if side_established {
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
            .any(|c| c.stranger && c.a == Some(AcceptSide::Established))
        {
            return Err("a stranger's connection was admitted".into());
        }
        let wanted = self.daemons.iter().any(|d| d.wants);
        let [a, b] = &self.daemons;
        match (a.link, b.link) {
            (Some((ca, _)), Some((cb, _))) if ca == cb => {
                let c = &self.conns[ca];
                if c.a != Some(AcceptSide::Established) || c.d != Some(DialSide::Established) {
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
        if !seen.insert(w.clone()) {
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
fn a_strangers_hellos_change_no_outcome() {
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
}
