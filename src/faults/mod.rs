//! Fault handling, sans-IO part: heartbeat bookkeeping for tree neighbours, and the notices
//! daemons exchange when one dies (report to rank 0, confirmation with a new epoch, adoption of
//! orphaned children, "you were declared dead", "rank 0 is gone"). The driver sends and receives
//! them; `routed` computes the repaired tree.

pub mod heartbeat;
pub mod notice;

pub use heartbeat::{HeartbeatMonitor, Tick};
pub use notice::{Adoption, Confirmation, NoticeError, Report, Restored};
pub mod leave;
pub mod rejoin;
