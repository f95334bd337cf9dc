//! An orderly leave on the wire (issue "Rejoin and grow": shrink). A daemon asks rank 0 to take
//! it out of the DVM; rank 0 confirms the departure to every daemon in a new epoch (a fault
//! confirmation that also lists it among [`super::Confirmation::departed`]: every daemon repairs
//! the tree around it as around a death, but reports it as departed, not failed); once every
//! living daemon has delivered that confirmation, nobody routes through the leaving daemon any
//! more and rank 0 tells it that it may stop.
//!
//! Both messages are empty:
//! - leave request: to rank 0 over RELM (a reliable runtime message, so it follows the leaving
//!   daemon's own reliable messages and survives repairs on its way);
//! - left: from rank 0 to the leaving daemon, directly (it is out of the tree by then).

/// Runtime tag: a daemon asks rank 0 to take it out of the DVM in order.
pub const TAG_LEAVE: u32 = 26;
/// Runtime tag: every living daemon knows of the departure; the leaving daemon stops.
pub const TAG_LEFT: u32 = 27;
