//! The messaging API's sans-IO core: tags, posted receives and the unmatched list.
//!
//! The [`Matcher`] stores no callbacks: it hands out a [`ReceiveId`] per posted receive and
//! says which id each message goes to; the driver keeps the callbacks keyed by that id.

// Batch frames' layout, for the node and the fuzz targets: not API.
#[doc(hidden)]
pub mod batch_frame;
// Runs of small messages in one batch payload, for plain and reliable batch frames.
mod matcher;
mod message_ref;
pub(crate) mod runs;
mod tag;

pub use matcher::{Message, Peer, RecvMode};
pub use message_ref::MessageRef;
// The matcher itself, for the node: not API.
#[doc(hidden)]
pub use matcher::{Dispatch, Matcher, PostError, ReceiveId};
pub use tag::{TAG_USER_MIN, Tag, is_user_tag};
