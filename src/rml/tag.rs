//! Message tags and the runtime's reserved range.

/// A message tag: receives are matched on (peer, tag). 32 bits on the wire, as in PRRTE.
pub type Tag = u32;

/// Tags below this are reserved for the runtime itself (as in PRRTE); user sends and receives
/// must use `tag >= TAG_USER_MIN`.
///
/// The [`Matcher`](super::Matcher) accepts every tag (the runtime's own layers use it too); the
/// public send/receive API is where a user tag below this bound is refused.
pub const TAG_USER_MIN: Tag = 100;

/// Whether `tag` may be used by a user of the library (not reserved for the runtime).
pub fn is_user_tag(tag: Tag) -> bool {
    tag >= TAG_USER_MIN
}
